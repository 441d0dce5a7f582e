"""Hugging Face ``Trainer`` (through ``accelerate``) trains on ``neuron``, not silently on the CPU.

transformers and accelerate decide a machine has Neuron devices by finding a module
named ``torch_neuronx``; torchneuron ships one (docs/torch_neuronx.md). These tests run
``Trainer`` as a user would: a tiny Llama built from its config (no downloads), bf16
autocast and gradient checkpointing, a checkpoint, and ``resume_from_checkpoint``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import torchneuron
from torchneuron.testing import is_on_neuron

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

STEPS = 4
SAVE_AT = 2
SEQ = 16
SAMPLES = 8  # batch 2 -> 4 steps per epoch


class _TokenDataset(torch.utils.data.Dataset):
    """Fixed random token sequences; labels are the inputs (causal LM)."""

    def __init__(self, vocab: int) -> None:
        generator = torch.Generator().manual_seed(4321)
        self.ids = torch.randint(3, vocab, (SAMPLES, SEQ), generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(1234)
    return LlamaForCausalLM(config)


def _args(output_dir: Path, **overrides):
    from transformers import TrainingArguments

    settings = dict(output_dir=str(output_dir), use_cpu=False, max_steps=STEPS, per_device_train_batch_size=2,
                    learning_rate=1e-3, logging_steps=1, save_strategy="steps", save_steps=SAVE_AT,
                    report_to=[], seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True)
    settings.update(overrides)
    return TrainingArguments(**settings)


def _trainer(args):
    from transformers import Trainer

    model = _model()
    data = _TokenDataset(model.config.vocab_size)
    return Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)


def _losses(trainer) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def _train(args, resume: str | None = None) -> tuple[torch.nn.Module, dict[int, float]]:
    trainer = _trainer(args)
    trainer.train(resume_from_checkpoint=resume)
    return trainer.model, _losses(trainer)


def test_torch_neuronx_is_found_by_transformers_and_accelerate():
    from accelerate.utils import is_neuron_available
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_neuron_available

    assert importlib.util.find_spec("torch_neuronx") is not None
    assert is_torch_neuron_available() and is_neuron_available()
    assert is_torch_bf16_gpu_available()  # via torch.neuron.is_bf16_supported()


def test_training_arguments_pick_neuron(tmp_path):
    assert _args(tmp_path).device == torch.device("neuron", 0)
    assert _args(tmp_path, use_cpu=True).device == torch.device("cpu")


def test_trainer_bf16_gradient_checkpointing_trains_on_neuron_and_resumes(tmp_path):
    trainer = _trainer(_args(tmp_path / "full", bf16=True, gradient_checkpointing=True))
    layer_inputs = []  # the first decoder layer's input at each call (a pre-hook: recomputation
    # stops early, once it has what backward needs, so a forward hook would not see it)
    trainer.model.model.layers[0].register_forward_pre_hook(lambda m, args: layer_inputs.append(args[0]))
    torchneuron.metrics.reset()
    trainer.train()
    model, full = trainer.model, _losses(trainer)

    assert sorted(full) == list(range(1, STEPS + 1))
    # Gradient checkpointing ran each layer's forward again in backward, on the device.
    assert model.is_gradient_checkpointing and len(layer_inputs) == 2 * STEPS
    assert all(is_on_neuron(x) for x in layer_inputs)
    assert all(is_on_neuron(p) for p in model.parameters())
    # bf16 autocast ran the model's matmuls on the device, none of them on the CPU.
    ops = torchneuron.metrics.ops()
    assert any(c.op == "aten::mm" and c.dtypes == ("bfloat16", "bfloat16") for c in ops)
    assert not any(c.op.startswith("aten::mm") and c.cpu_fallback for c in ops)
    checkpoint = tmp_path / "full" / f"checkpoint-{SAVE_AT}"
    assert (checkpoint / "optimizer.pt").is_file() and (checkpoint / "trainer_state.json").is_file()

    # A new run resumed from the step-SAVE_AT checkpoint continues with the same losses.
    # (The log history up to SAVE_AT comes back from the checkpoint; later steps are new.)
    _, history = _train(_args(tmp_path / "resumed", bf16=True, gradient_checkpointing=True),
                        resume=str(checkpoint))
    resumed = {step: loss for step, loss in history.items() if step > SAVE_AT}
    assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1))
    assert resumed == {step: full[step] for step in resumed}


def test_trainer_on_neuron_equals_trainer_on_cpu(tmp_path):
    """fp32 training on neuron gives CPU's losses and weights (neuron runs CPU's kernels)."""
    results = {}
    for device, use_cpu in (("cpu", True), ("neuron", False)):
        trainer = _trainer(_args(tmp_path / device, use_cpu=use_cpu, save_strategy="no"))
        trainer.train()
        results[device] = trainer.model, _losses(trainer), trainer.evaluate()["eval_loss"]
    (cpu_model, cpu, cpu_eval), (neuron_model, neuron, neuron_eval) = results["cpu"], results["neuron"]
    assert cpu_model.device.type == "cpu" and is_on_neuron(next(neuron_model.parameters()))
    assert neuron == cpu and len(neuron) == STEPS
    assert neuron_eval == cpu_eval
    for (name, p_cpu), p_neuron in zip(cpu_model.named_parameters(), neuron_model.parameters()):
        assert torch.equal(p_neuron.detach().cpu(), p_cpu.detach()), name


@pytest.mark.slow
def test_trainer_torch_compile_uses_the_neuron_backend(tmp_path):
    """``torch_compile=True`` picks ``backend="neuron"`` and trains as eager does."""
    torch._dynamo.reset()
    torch.neuron.reset_compile_metrics()
    compiled_args = _args(tmp_path / "compiled", torch_compile=True, save_strategy="no")
    assert compiled_args.torch_compile_backend == "neuron"
    _, compiled = _train(compiled_args)
    metrics = torch.neuron.compile_metrics()
    assert metrics["compiles"] >= 1 and metrics["eager_fallbacks"] == 0
    _, eager = _train(_args(tmp_path / "eager", save_strategy="no"))
    assert sorted(compiled) == sorted(eager)
    for step, loss in eager.items():  # compiled kernels sum in another order: float32 rounding
        assert compiled[step] == pytest.approx(loss, rel=1e-5)
