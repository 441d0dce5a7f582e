"""A Llama trained with FSDP2 over `dp` and tensor parallelism over `tp` (torchtitan's layout),
sized by its arguments, built on the meta device and materialised with `to_empty`.

Run for real on a few ranks:      torchrun --nproc-per-node 2 examples/planning/llama_fsdp_tp.py --tp 2
Plan it at full scale (dataless): torchneuron plan --nodes 4 -- examples/planning/llama_fsdp_tp.py --tp 8 \
    --layers 80 --dim 8192 --ffn 28672 --heads 64 --kv 8 --vocab 128256 --seq 8192 --batch 1 --ac full
"""
import argparse, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.checkpoint import checkpoint
p = argparse.ArgumentParser()
for name, default in (("tp", 1), ("layers", 2), ("dim", 256), ("ffn", 1024), ("heads", 8), ("kv", 4), ("vocab", 1024),
                      ("seq", 128), ("batch", 2), ("steps", 2)):
    p.add_argument(f"--{name}", type=int, default=default)
p.add_argument("--ac", default="none", choices=("none", "full"))
a = p.parse_args()
dist.init_process_group("neuron")
world = dist.get_world_size()
mesh = init_device_mesh("neuron", (world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                  num_attention_heads=a.heads, num_key_value_heads=a.kv, max_position_embeddings=a.seq)
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
if a.ac == "full":
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
if a.tp > 1:
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()})
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.model.layers:
    fully_shard(layer, mesh=mesh["dp"], mp_policy=mp)
fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
model.to_empty(device="neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="neuron")
for step in range(a.steps):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad()
dist.destroy_process_group()
