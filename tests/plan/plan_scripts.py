"""Training scripts the planning tests run as a user would: files, arguments, torchrun's environment."""

FSDP_TP_LLAMA = '''
import argparse, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--tp", type=int, default=1)
parser.add_argument("--seq", type=int, default=32)
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()
dist.init_process_group("neuron")
mesh = init_device_mesh("neuron", (dist.get_world_size() // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq)
with torch.device("meta"):
    model = LlamaForCausalLM(config)
if args.tp > 1:
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], plan)
for layer in model.model.layers:  # FSDP over dp (one rank too: every parameter is then a DTensor)
    fully_shard(layer, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
model.to_empty(device="neuron")
for p in model.parameters():
    torch.nn.init.normal_(p, std=0.02)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 512, (2, args.seq), device="neuron")
for step in range(args.steps):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")  # a read of a value: planned, listed
dist.destroy_process_group()
'''


PIPELINE = '''
import argparse, torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

parser = argparse.ArgumentParser()
parser.add_argument("--schedule", default="gpipe")
parser.add_argument("--microbatches", type=int, default=4)
args = parser.parse_args()
dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
dim, batch = 256, 32
stage_module = nn.Sequential(*[nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
                               for _ in range(2)]).to("neuron")
example = torch.empty(batch // args.microbatches, dim, device="meta")
stage = PipelineStage(stage_module, rank, world, torch.device("neuron", torch.neuron.current_device()),
                      input_args=(example,), output_args=(example,))
schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule](
    stage, n_microbatches=args.microbatches, loss_fn=lambda out, target: (out - target).pow(2).mean())
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.01)
x, y = torch.randn(batch, dim, device="neuron"), torch.randn(batch, dim, device="neuron")
for _ in range(2):
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
'''


GENERATE = '''
import argparse, torch
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--prompt", type=int, default=64)
parser.add_argument("--new", type=int, default=6)
args = parser.parse_args()
config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2)
with torch.device("neuron"):
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
ids = torch.randint(0, 512, (args.batch, args.prompt), device="neuron")
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)
'''


# A two-layer model fully sharded over every rank: the checkpointing scripts' common start.
_FSDP_MODEL = '''
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("neuron")
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).to("neuron")
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
'''

CHECKPOINT = _FSDP_MODEL + '''optimizer = torch.optim.AdamW(model.parameters())
for step in range(2):
    model(torch.randn(4, 64, device="neuron")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=os.path.join(sys.argv[1], str(step)))
dist.destroy_process_group()
'''


PIPELINE_INTERLEAVED = '''
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
dim, batch, microbatches, per_rank = 256, 32, 4, 2  # two stages of one block per rank
device = torch.device("neuron", torch.neuron.current_device())
example = torch.empty(batch // microbatches, dim, device="meta")
stages, params = [], []
for local in range(per_rank):
    module = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)).to("neuron")
    params += list(module.parameters())
    stages.append(PipelineStage(module, rank + local * world, world * per_rank, device,
                                input_args=(example,), output_args=(example,)))
schedule = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches,
                                   loss_fn=lambda out, target: (out - target).pow(2).mean())
optimizer = torch.optim.SGD(params, lr=0.01)
x, y = torch.randn(batch, dim, device="neuron"), torch.randn(batch, dim, device="neuron")
for _ in range(2):
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
'''


RESUME = _FSDP_MODEL + '''state = {"model": get_model_state_dict(model)}
dcp.load(state, checkpoint_id=sys.argv[1])
set_model_state_dict(model, state["model"])
model(torch.randn(4, 64, device="neuron")).sum().backward()
dist.destroy_process_group()
'''

GLOO_GROUPS = '''
import torch, torch.distributed as dist
dist.init_process_group("cpu:gloo,neuron:neuron")
cpu_group = dist.new_group(backend="gloo")
counts = torch.ones(4)
dist.all_reduce(counts, group=cpu_group)  # a user's CPU-side group
flag = torch.tensor([1])
dist.all_reduce(flag)  # a CPU tensor on the default group: its gloo half
x = torch.ones(1024, device="neuron")
dist.all_reduce(x)
dist.destroy_process_group()
'''
