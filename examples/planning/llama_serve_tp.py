"""Serve a Llama with tensor parallelism over every rank (NxD Inference's layout for one
instance), timed by `generate()`: prefill of the prompt, then one decode step per new token.

Key/value heads are replicated up to the tensor-parallel degree when there are fewer of them
than ranks, as NxD Inference does (each rank holds one query head and one key/value head at
TP=64 for Llama-3.3-70B): `--kv` is the model's count, the script replicates.

Real run (small):  torchrun --nproc-per-node 2 examples/planning/llama_serve_tp.py
Planned at scale:  torchneuron plan --instance trn2.48xlarge -- examples/planning/llama_serve_tp.py \\
    --layers 80 --dim 8192 --ffn 28672 --heads 64 --kv 8 --vocab 128256 --prompt 10000 --new 8
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
for name, default in (("layers", 2), ("dim", 256), ("ffn", 1024), ("heads", 8), ("kv", 4), ("vocab", 1024),
                      ("prompt", 64), ("new", 4), ("batch", 1)):
    parser.add_argument(f"--{name}", type=int, default=default)
parser.add_argument("--cache", default="dynamic", choices=("dynamic", "static"),
                    help="Hugging Face's KV cache: grown by concatenation, or preallocated (as NxD Inference's)")
parser.add_argument("--compile", action="store_true", help="torch.compile(backend='neuron') the model's forward")
args = parser.parse_args()
dist.init_process_group("neuron")
tp = dist.get_world_size()
mesh = init_device_mesh("neuron", (tp,), mesh_dim_names=("tp",))
kv_heads = max(args.kv, tp) if args.heads % tp == 0 else args.kv  # replicated to one per rank
config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.ffn,
                     num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=kv_heads,
                     max_position_embeddings=args.prompt + args.new, torch_dtype=torch.bfloat16)
with torch.device("meta"):
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
layer_plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
              "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
              "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
for layer in model.model.layers:
    parallelize_module(layer, mesh, layer_plan)
parallelize_module(model.lm_head, mesh, ColwiseParallel(output_layouts=Replicate()))
model.to_empty(device="neuron")
if args.compile:
    model.forward = torch.compile(model.forward, backend="neuron")
ids = torch.randint(0, args.vocab, (args.batch, args.prompt), device="neuron")
with torch.no_grad():
    model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                   cache_implementation="static" if args.cache == "static" else None)
dist.destroy_process_group()
