"""The job a plan stands for: instance type, instance count, LNC, and each rank's environment.

A rank of the job is placed as torchrun places it on ``nodes`` instances with one process per
logical NeuronCore: global rank ``g`` runs on instance ``g // per_instance`` as
``LOCAL_RANK = g % per_instance`` (trainium-facts.md, TorchNeuron: one process per logical
core; 64 ranks per trn2.48xlarge at LNC=2). :meth:`World.environment` is what torchrun
would export to that rank, plus the switches that make the process a dataless rank of a
simulated job.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchneuron.config import MAX_DEVICES
from torchneuron.hardware.specs import INSTANCES, get_instance
from torchneuron.hardware.topology import Topology, resolve_topology

__all__ = ["World", "DEFAULT_INSTANCE"]

DEFAULT_INSTANCE = "trn2.48xlarge"


@dataclass(frozen=True)
class World:
    """``nodes`` instances of type ``instance`` at ``lnc`` physical cores per logical core."""

    instance: str = DEFAULT_INSTANCE
    nodes: int = 1
    lnc: int | None = None  # None: the chip's default (2 on Trn2/Trn3)
    nproc_per_node: int | None = None  # ranks per instance (torchrun's); None: one per logical core

    def __post_init__(self) -> None:
        if self.instance.lower() not in INSTANCES:
            get_instance(self.instance)  # raises ValueError naming the known instances
        if self.nodes < 1:
            raise ValueError(f"a job needs at least one instance, got nodes={self.nodes}")
        if self.lnc not in (None, 1, 2):
            raise ValueError(f"--lnc {self.lnc}: use 1 or 2 (NEURON_LOGICAL_NC_CONFIG)")
        devices = self.topology.device_count
        if self.nproc_per_node is not None and not 1 <= self.nproc_per_node <= devices:
            raise ValueError(f"--nproc-per-node {self.nproc_per_node}: a {self.instance} has {devices} "
                             f"logical cores at LNC={self.topology.lnc}; use 1 to {devices}")

    @property
    def topology(self) -> Topology:
        """One instance's devices, as a rank's process sees them."""
        return resolve_topology(instance=self.instance, lnc=self.lnc)

    @property
    def ranks_per_instance(self) -> int:
        return self.nproc_per_node or self.topology.device_count

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_instance

    def describe(self) -> str:
        topology = self.topology
        return (f"{self.nodes} x {self.instance} ({topology.chip.name}, LNC={topology.lnc}): "
                f"{self.world_size} ranks, {self.ranks_per_instance} per instance")

    def environment(self, rank: int) -> dict[str, str]:
        """torchrun's variables for global ``rank``, and the simulated-job switches."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a job of {self.world_size} ranks ({self.describe()})")
        per = self.ranks_per_instance
        node, local = divmod(rank, per)
        env = {
            "RANK": str(rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(per),
            "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(self.nodes),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(self.world_size), "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "torchneuron-plan",
            "TORCHNEURON_INSTANCE": self.instance, "TORCHNEURON_DATALESS": "1",
            "TORCHNEURON_SIMULATED_WORLD": "1",
        }
        if self.lnc is not None:
            env["NEURON_LOGICAL_NC_CONFIG"] = str(self.lnc)
        if self.topology.device_count > MAX_DEVICES:
            # A process numbers at most 127 devices of a type (config.MAX_DEVICES): the rank
            # sees its own logical core only, TorchNeuron's one-core-per-process convention.
            env["NEURON_RT_VISIBLE_CORES"] = str(local)
        return env
