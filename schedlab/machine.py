"""Machine descriptions: devices (cores, memory, streams), the processes that drive them,
and the links between them.

A Machine is a description, not a detection (DESIGN.md, invariant 4). `detect_host()`
writes down the machine the executor runs on; `host_ranks(n)` splits it into n ranks (one
process and one CPU device each, the way `--devices N` runs here); the simulator takes any
Machine, including the presets for hardware the project does not have.

A *process* is what has one interpreter lock, one worker pool and one ready queue: a rank
of the multi-process executor. Each device names the process that drives it (`process`);
devices of one process share its lock (a CPU and the GPUs one Python process drives).
Device kinds are "cpu" and "cuda" ("gpu" is read as "cuda").

A *core pool* is a set of cores that the processes of several CPU devices share, unpinned:
the ranks of one host that runs more ranks than it has cores. Each such device names its
pool (`core_pool`), the machine says how many cores each pool has (`core_pools`), and the
simulator runs the kernels of all of a pool's devices on those cores, processor-shared, as
the operating system time-slices the ranks' threads. A device in no pool has its `cores` to
itself.
"""

from __future__ import annotations

import math
import os
import platform
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schedlab.errors import SchedlabError

MACHINE_SCHEMA_VERSION = 1
DEVICE_KINDS = ("cpu", "cuda")
_KIND_ALIASES = {"gpu": "cuda"}

# Loopback link between local ranks before `schedlab calibrate --links` has measured one:
# that command's fit on this project's 2-core CI VM, quiet (torch 2.13, gloo, one thread
# and one core per rank, 2026-11-23): send/recv ping-pong over 4 B - 64 MiB, one-way time
# = 52.5 us + bytes / 2.76 GB/s (fit MAPE 7.2%). A calibrated Profile's link fit replaces
# it (`calibrate.links.apply_link_fit`).
LOOPBACK_LATENCY_S = 52.5e-6
LOOPBACK_BW_BYTES_PER_S = 2.76e9
LOOPBACK_LINK = "loopback"  # the name of the links between local ranks, which calibration measures
_HOST_POOL = "host"  # the core pool of local ranks that outnumber the host's cores


@dataclass(frozen=True)
class Device:
    id: str  # "cpu0", "gpu3"
    kind: str  # "cpu" or "cuda" ("gpu" is accepted and stored as "cuda")
    cores: int  # CPU cores usable by intra-op threads (for a GPU: its host-side cores, 1)
    memory_bytes: int
    streams: int = 1  # concurrent GPU streams (CPU: 1)
    peak_flops: float = 0.0  # device peak, FLOP/s (0: unknown, the Profile decides)
    mem_bw_bytes_per_s: float = 0.0  # device memory bandwidth (0: unknown)
    process: int = 0  # the process (rank) that drives it: one interpreter lock per process
    core_pool: str = ""  # CPU devices naming the same pool share its cores (Machine.core_pools)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _KIND_ALIASES.get(self.kind, self.kind))

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def capacity(self) -> int:
        """What its kernels share: cores on a CPU, streams on a GPU."""
        return self.streams if self.is_gpu else self.cores

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Link:
    """A directed-or-shared link between two devices."""

    src: str
    dst: str
    bw_bytes_per_s: float
    latency_s: float
    name: str = ""  # links with the same non-empty name share one wire (contention)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Machine:
    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...] = ()
    host: dict[str, Any] = field(default_factory=dict)  # cpu model, sockets, hostname...
    core_pools: dict[str, int] = field(default_factory=dict)  # pool name -> cores its devices share

    def pool_cores(self, device: Device) -> int:
        """The cores `device`'s kernels run on: its pool's, else its own capacity."""
        return self.core_pools[device.core_pool] if device.core_pool else device.capacity

    def device(self, device_id: str) -> Device:
        for d in self.devices:
            if d.id == device_id:
                return d
        known = ", ".join(d.id for d in self.devices)
        raise SchedlabError(f"unknown device {device_id!r} (machine {self.name!r} has: {known})")

    @property
    def default_device(self) -> Device:
        return self.devices[0]

    @property
    def processes(self) -> tuple[int, ...]:
        """The process (rank) ids, ascending."""
        return tuple(sorted({d.process for d in self.devices}))

    def devices_of(self, process: int) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.process == process)

    def first_devices(self, n: int) -> Machine:
        """This machine cut to its first `n` devices (in listed order) and the links among
        them: `--devices N` on a preset (dgx-8gpu --devices 4 is four of its GPUs)."""
        if not 1 <= n <= len(self.devices):
            raise SchedlabError(
                f"--devices {n}: machine {self.name!r} has {len(self.devices)} devices "
                f"({', '.join(d.id for d in self.devices)}); give 1..{len(self.devices)}"
            )
        if n == len(self.devices):
            return self
        keep = self.devices[:n]
        ids = {d.id for d in keep}
        links = tuple(lk for lk in self.links if lk.src in ids and lk.dst in ids)
        pools = {d.core_pool: self.core_pools[d.core_pool] for d in keep if d.core_pool}
        return replace(self, name=f"{self.name}[:{n}]", devices=keep, links=links, core_pools=pools)

    def with_link_fit(self, latency_s: float, bw_bytes_per_s: float, *, name: str = LOOPBACK_LINK) -> Machine:
        """This machine with every link named `name` given a calibrated latency and bandwidth."""
        links = tuple(
            Link(lk.src, lk.dst, bw_bytes_per_s, latency_s, lk.name) if lk.name == name else lk for lk in self.links
        )
        return replace(self, links=links)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What must match for a Profile measured on one machine to hold on another."""
        return {
            "cpu_model": self.host.get("cpu_model", ""),
            "cores": self.default_device.cores,
            "torch": self.host.get("torch", ""),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "schedlab.machine",
            "version": MACHINE_SCHEMA_VERSION,
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
            "links": [lk.to_json() for lk in self.links],
            "host": self.host,
            **({"core_pools": self.core_pools} if self.core_pools else {}),
        }

    @staticmethod
    def from_json(d: Any) -> Machine:
        if not isinstance(d, dict) or d.get("schema") != "schedlab.machine":
            raise SchedlabError('not a schedlab machine file (missing "schema": "schedlab.machine")')
        if d.get("version") != MACHINE_SCHEMA_VERSION:
            raise SchedlabError(
                f"machine version {d.get('version')!r} is not supported (expected {MACHINE_SCHEMA_VERSION})"
            )
        where = ""  # the device or link being read, for the error
        try:
            if not isinstance(d.get("devices"), list):
                raise ValueError(f"field 'devices' must be a list of devices, got {d.get('devices')!r}")
            devices = []
            for i, x in enumerate(d["devices"]):
                where = f"devices[{i}]"
                devices.append(
                    Device(
                        id=str(x["id"]),
                        kind=str(x["kind"]),
                        cores=_number(x, "cores", int),
                        memory_bytes=_number(x, "memory_bytes", int),
                        streams=_number(x, "streams", int, 1),
                        peak_flops=_number(x, "peak_flops", float, 0.0),
                        mem_bw_bytes_per_s=_number(x, "mem_bw_bytes_per_s", float, 0.0),
                        process=_number(x, "process", int, 0),
                        core_pool=str(x.get("core_pool", "")),
                    )
                )
            links = []
            for i, x in enumerate(d.get("links", [])):
                where = f"links[{i}]"
                links.append(
                    Link(
                        src=str(x["src"]),
                        dst=str(x["dst"]),
                        bw_bytes_per_s=_number(x, "bw_bytes_per_s", float),
                        latency_s=_number(x, "latency_s", float),
                        name=str(x.get("name", "")),
                    )
                )
            where = "core_pools"
            pools = d.get("core_pools", {})
            if not isinstance(pools, dict):
                raise ValueError(f"must map pool names to core counts, got {pools!r}")
            core_pools = {str(k): _number(pools, k, int) for k in pools}
            where = ""
            m = Machine(name=str(d["name"]), devices=tuple(devices), links=tuple(links), host=dict(d.get("host", {})),
                        core_pools=core_pools)
        except (KeyError, TypeError, ValueError) as e:
            detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise SchedlabError(f"corrupt machine description: {where + ': ' if where else ''}{detail}") from None
        m.check()
        return m

    def check(self) -> None:
        if not self.devices:
            raise SchedlabError(f"machine {self.name!r} has no devices")
        ids = [d.id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise SchedlabError(f"machine {self.name!r} repeats a device id: {ids}")
        for d in self.devices:
            if d.kind not in DEVICE_KINDS:
                raise SchedlabError(f"device {d.id}: kind must be 'cpu' or 'cuda', not {d.kind!r}")
            if d.process < 0:
                raise SchedlabError(f"device {d.id}: process must be >= 0, got {d.process}")
            for key, value, least in (("cores", d.cores, 1), ("streams", d.streams, 1), ("memory_bytes", d.memory_bytes, 1)):
                if value < least:
                    raise SchedlabError(f"device {d.id}: {key} must be >= {least}, got {value}")
            if d.core_pool and d.core_pool not in self.core_pools:
                raise SchedlabError(
                    f"device {d.id}: core_pool {d.core_pool!r} is not in the machine's core_pools "
                    f"({', '.join(self.core_pools) or 'none'}); add it with its core count"
                )
            if d.core_pool and d.kind != "cpu":
                raise SchedlabError(f"device {d.id}: only CPU devices share a core pool, not a {d.kind!r} one")
        for name, cores in self.core_pools.items():
            if cores < 1:
                raise SchedlabError(f"core pool {name!r}: cores must be >= 1, got {cores}")
        procs = self.processes
        if procs != tuple(range(len(procs))):
            raise SchedlabError(f"machine {self.name!r}: process ids must be 0..{len(procs) - 1}, got {list(procs)}")
        for lk in self.links:
            for end in (lk.src, lk.dst):
                if end not in ids:
                    raise SchedlabError(f"link {lk.src}->{lk.dst} names unknown device {end!r}")
            if lk.bw_bytes_per_s <= 0 or lk.latency_s < 0:
                raise SchedlabError(f"link {lk.src}->{lk.dst}: bandwidth must be > 0 and latency >= 0")

    def save(self, path: str | Path) -> Path:
        from schedlab.io import write_json_atomic

        return write_json_atomic(path, self.to_json(), indent=1)


def _number(x: Any, key: str, kind: type[int] | type[float], default: float | None = None) -> Any:
    """Field `key` of a device or link as `kind`: a JSON number (an integer for int), else ValueError."""
    v = x[key] if default is None else x.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
        kind is int and v != int(v)
    ):
        raise ValueError(f"field {key!r} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    return kind(v)


def cpu_topology(cpuinfo_text: str) -> tuple[int, int]:
    """(physical cores, sockets) from /proc/cpuinfo text ("cpu cores" per "physical id");
    (0, 0) when the text does not say."""
    cores_of: dict[str, int] = {}
    for block in cpuinfo_text.split("\n\n"):
        phys, cores = "0", 0
        for line in block.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "physical id":
                phys = value.strip()
            elif key == "cpu cores":
                try:
                    cores = int(value.strip())
                except ValueError:
                    cores = 0
        if cores:
            cores_of[phys] = cores
    return sum(cores_of.values()), len(cores_of)


def _read_cpuinfo() -> tuple[str, int, int]:
    """(CPU model, physical cores, sockets) of this host; 0 where /proc/cpuinfo does not say."""
    model = platform.processor() or "unknown"
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, 0, 0
    for line in text.splitlines():
        if line.startswith("model name") and ":" in line:
            model = line.split(":", 1)[1].strip()
            break
    physical, sockets = cpu_topology(text)
    return model, physical, sockets


def _mem_total_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def detect_host() -> Machine:
    """The machine this process runs on, as one CPU device."""
    import torch

    model, physical, sockets = _read_cpuinfo()
    cores = usable_cores()
    return Machine(
        name="host",
        devices=(Device(id="cpu0", kind="cpu", cores=cores, memory_bytes=_mem_total_bytes()),),
        host={
            "hostname": socket.gethostname(),
            "cpu_model": model,
            "sockets": sockets or 1,
            "physical_cores": physical or cores,
            "logical_cores": os.cpu_count() or cores,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
        },
    )


def cpu_index(device_id: str) -> int | None:
    """K of a local CPU device id "cpuK" (as `host_ranks` and TensorFlow's logical CPU
    devices are named); None for any other id."""
    if device_id.startswith("cpu") and device_id[3:].isdigit():
        return int(device_id[3:])
    return None


def host_ranks(n: int, host: Machine | None = None) -> Machine:
    """This host as `n` local ranks: CPU devices cpu0..cpu{n-1}, one process each, the
    usable cores split between them (at least one core each), and one shared loopback
    wire between every pair (gloo over TCP on one host: transfers contend). More ranks than
    cores: each rank runs one thread, and all of them share the host's cores (one core
    pool), which the simulator time-slices as the operating system does."""
    host = host or detect_host()
    if n < 1:
        raise SchedlabError(f"--devices must be >= 1, got {n}")
    base = host.default_device
    if n == 1:
        return host
    cores = max(1, base.cores // n)
    pool = _HOST_POOL if n > base.cores else ""  # more ranks than cores: they time-share the host's
    devices = tuple(
        Device(id=f"cpu{i}", kind="cpu", cores=cores, memory_bytes=base.memory_bytes // n, process=i, core_pool=pool)
        for i in range(n)
    )
    links = tuple(
        Link(f"cpu{i}", f"cpu{j}", LOOPBACK_BW_BYTES_PER_S, LOOPBACK_LATENCY_S, name=LOOPBACK_LINK)
        for i in range(n)
        for j in range(n)
        if i != j
    )
    return Machine(name=f"host-{n}ranks", devices=devices, links=links, host={**host.host, "ranks": n},
                   core_pools={pool: base.cores} if pool else {})


def _manycore_68() -> Machine:
    # Intel Xeon Phi 7250 (Knights Landing), the many-core CPU of the concurrency-control
    # paper (Liu et al., IPDPS 2019): 68 cores at 1.4 GHz, 16 GiB MCDRAM at ~400 GB/s,
    # 2 AVX-512 FMA units per core: 68 * 1.4e9 * 32 * 2 FLOP/s ~ 6.1 TFLOP/s fp32 peak.
    return Machine(
        name="manycore-68",
        devices=(
            Device(
                id="cpu0",
                kind="cpu",
                cores=68,
                memory_bytes=16 * 2**30,
                peak_flops=6.09e12,
                mem_bw_bytes_per_s=400e9,
            ),
        ),
        host={"cpu_model": "Intel Xeon Phi 7250 (preset)", "sockets": 1},
    )


def _dgx_8gpu() -> Machine:
    # 8 GPUs of 80 GiB each on NVLink through NVSwitch (one DGX A100-style node): each GPU
    # reaches each other at ~300 GB/s per direction with ~5 us latency, and every
    # transfer out of a GPU shares that GPU's NVLink port (link name = port).
    # The GPU is an A100-SXM4-80GB: 19.5 TFLOP/s fp32 without tensor cores (what the fp32
    # graphs run at: PyTorch's default fp32 matmul uses no TF32; 16-bit tensor cores would
    # give 312 TFLOP/s) and 2.039 TB/s of HBM2e (NVIDIA A100 datasheet). These feed the
    # simulator's roofline of an uncalibrated GPU (`sim.device_cost`).
    gpus = tuple(
        Device(
            id=f"gpu{i}",
            kind="cuda",
            cores=1,
            memory_bytes=80 * 2**30,
            streams=4,
            peak_flops=19.5e12,
            mem_bw_bytes_per_s=2.039e12,
            process=i,  # one rank per GPU, as torchrun starts them
        )
        for i in range(8)
    )
    cpu = Device(id="cpu0", kind="cpu", cores=64, memory_bytes=1024 * 2**30, process=0)
    links = tuple(
        Link(src=f"gpu{i}", dst=f"gpu{j}", bw_bytes_per_s=300e9, latency_s=5e-6, name=f"nvlink{i}")
        for i in range(8)
        for j in range(8)
        if i != j
    ) + tuple(
        Link(src=f"gpu{i}", dst="cpu0", bw_bytes_per_s=25e9, latency_s=10e-6, name=f"pcie{i}")
        for i in range(8)
    ) + tuple(
        Link(src="cpu0", dst=f"gpu{i}", bw_bytes_per_s=25e9, latency_s=10e-6, name=f"pcie{i}")
        for i in range(8)
    )
    return Machine(name="dgx-8gpu", devices=(*gpus, cpu), links=links, host={"cpu_model": "8x GPU node (preset)"})


def _cpu_gpus(n_gpus: int) -> Machine:
    # The placement paper's kind of heterogeneous node (Liu et al., HP3C 2019; one
    # TensorFlow process driving a multi-core CPU and its GPUs): a 2-socket, 24-core Xeon
    # (2 x 12 cores, AVX2 FMA at 2.5 GHz: 24 * 2.5e9 * 32 ~ 1.9 TFLOP/s fp32, ~120 GB/s)
    # and V100-class GPUs (V100-PCIe-16GB: 14 TFLOP/s fp32, 900 GB/s HBM2, 16 GiB; NVIDIA
    # V100 datasheet) on PCIe 3.0 x16 (~12 GB/s per direction, ~10 us). One process: every
    # device shares its lock. The GPU figures feed the roofline of `sim.device_cost`.
    cpu = Device(id="cpu0", kind="cpu", cores=24, memory_bytes=256 * 2**30, peak_flops=1.92e12,
                 mem_bw_bytes_per_s=120e9, process=0)
    gpus = tuple(
        Device(id=f"gpu{i}", kind="cuda", cores=1, memory_bytes=16 * 2**30, streams=2, peak_flops=14.0e12,
               mem_bw_bytes_per_s=900e9, process=0)
        for i in range(n_gpus)
    )
    ids = [cpu.id] + [g.id for g in gpus]
    links = tuple(
        Link(src=a, dst=b, bw_bytes_per_s=12e9, latency_s=10e-6, name="pcie-" + (a if a != "cpu0" else b))
        for a in ids
        for b in ids
        if a != b
    )
    return Machine(name=f"cpu-{n_gpus}gpu", devices=(cpu, *gpus), links=links,
                   host={"cpu_model": f"2x12-core Xeon + {n_gpus}x V100-class GPU (preset)", "sockets": 2})


def _two_socket_cpu() -> Machine:
    # A 2-socket many-core CPU node: 2 x 28 cores (Xeon Platinum 8280-class, AVX-512 at
    # ~2.0 GHz under load: 28 * 2.0e9 * 64 ~ 3.6 TFLOP/s and ~130 GB/s per socket), one
    # rank per socket, the sockets joined by UPI (~40 GB/s per direction, ~1 us through
    # shared memory).
    sockets = tuple(
        Device(id=f"cpu{i}", kind="cpu", cores=28, memory_bytes=192 * 2**30, peak_flops=3.58e12,
               mem_bw_bytes_per_s=130e9, process=i)
        for i in range(2)
    )
    links = (
        Link(src="cpu0", dst="cpu1", bw_bytes_per_s=40e9, latency_s=1e-6, name="upi01"),
        Link(src="cpu1", dst="cpu0", bw_bytes_per_s=40e9, latency_s=1e-6, name="upi10"),
    )
    return Machine(name="2socket-cpu", devices=sockets, links=links,
                   host={"cpu_model": "2x 28-core Xeon (preset)", "sockets": 2})


PRESETS = {
    "manycore-68": _manycore_68,
    "dgx-8gpu": _dgx_8gpu,
    "cpu-2gpu": lambda: _cpu_gpus(2),
    "cpu-4gpu": lambda: _cpu_gpus(4),
    "2socket-cpu": _two_socket_cpu,
}


def load_machine(spec: str | None, devices: int | None = None) -> Machine:
    """`None` or "host": this machine (as `devices` local ranks when given); a preset name;
    or a path to a machine JSON file. On a preset or a file, `devices` keeps its first
    `devices` devices (`Machine.first_devices`)."""
    if spec is None or spec == "host":
        return detect_host() if devices is None else host_ranks(devices)
    machine = _named_machine(spec)
    return machine if devices is None else machine.first_devices(devices)


def _named_machine(spec: str) -> Machine:
    if spec in PRESETS:
        return PRESETS[spec]()
    from schedlab.io import read_json

    if not Path(spec).exists():
        raise SchedlabError(
            f"machine {spec!r} is neither 'host', a preset ({', '.join(PRESETS)}) nor an existing JSON file"
        )
    d = read_json(spec, what="machine")
    try:
        return Machine.from_json(d)
    except SchedlabError as e:
        raise SchedlabError(f"machine file {spec}: {e}") from None
