"""Jobs on a shared cluster: what JOBS.json says, checked against the composed topology.

    {"jobs": [{"name": "tp0", "collective": "allgather", "ranks": [0, 2, 4], "size": "256MB",
               "weight": 1, "start_us": 0}, ...]}

Ranks are GPUs of the composed topology (`--hw NAME --nodes N`). A job's communicator numbers its
ranks in ascending order, as torch.distributed.new_group does; its XML is written for that
communicator (`ngpus` = the job's size). Every error is one line naming the job and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from compiler.model.topology import Topology
from compiler.specs.collectives import canonical, spec
from compiler.specs.errors import CompileError
from compiler.specs.jsonkeys import DuplicateKey, loads, unique_keys
from compiler.specs.units import parse_size

FIELDS = ("name", "collective", "ranks", "size", "weight", "start_us", "root")


class JobsError(CompileError):
    pass


@dataclass(frozen=True)
class JobSpec:
    name: str
    collective: str  # canonical name (compiler.specs.collectives)
    ranks: tuple[int, ...]  # global ranks, ascending: communicator rank i is ranks[i]
    size: int  # bytes, as nccl-tests counts them for the collective
    weight: float = 1.0
    start_s: float = 0.0
    root: int | None = None  # communicator rank of a rooted collective's root

    @property
    def ngpus(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict:
        return {"name": self.name, "collective": self.collective, "ranks": list(self.ranks), "size": self.size,
                "weight": self.weight, "start_us": self.start_s * 1e6, "root": self.root}


def load_jobs(path: str, topo: Topology) -> tuple[JobSpec, ...]:
    from compiler.fileio import read_input
    raw = read_input(path, "jobs file", JobsError)
    try:
        doc = loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise JobsError(f"{path}: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        where = f"line {e.lineno} column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise JobsError(f"{path}: not valid JSON: {where}") from None
    if not isinstance(doc, dict) or set(doc) != {"jobs"}:
        raise JobsError(f"{path}: must be {{\"jobs\": [...]}} (got {_short(doc)})")
    if not isinstance(doc["jobs"], list) or not doc["jobs"]:
        raise JobsError(f"{path}: jobs: must be a non-empty list")
    jobs = tuple(parse_job(path, i, j, topo) for i, j in enumerate(doc["jobs"]))
    check_together(path, jobs, topo)
    return jobs


def _short(x) -> str:
    text = json.dumps(x)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_job(path: str, i: int, j, topo: Topology) -> JobSpec:
    where = f"{path}: jobs[{i}]"
    if not isinstance(j, dict):
        raise JobsError(f"{where}: must be an object with {', '.join(FIELDS[:4])}")
    unknown = sorted(set(j) - set(FIELDS))
    if unknown:
        raise JobsError(f"{where}.{unknown[0]}: unknown field (allowed: {', '.join(FIELDS)})")
    name = j.get("name", f"job{i}")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "._-" for c in name):
        raise JobsError(f"{where}.name: {name!r} must be letters, digits, . _ or - (it names the XML file)")
    where = f"{path}: job {name!r}"
    for field in ("collective", "ranks", "size"):
        if field not in j:
            raise JobsError(f"{where}: {field}: required field is missing")
    collective = _collective(where, j["collective"])
    ranks = _ranks(where, j["ranks"], topo)
    size = _size(where, j["size"])
    weight = _number(where, "weight", j.get("weight", 1), positive=True)
    start = _number(where, "start_us", j.get("start_us", 0), positive=False) * 1e-6
    root = j.get("root")
    cs = spec(collective)
    if root is not None and (not cs.rooted or not isinstance(root, int) or isinstance(root, bool)
                             or not 0 <= root < len(ranks)):
        why = f"{cs.name} has no root" if not cs.rooted else f"must be a communicator rank 0..{len(ranks) - 1}"
        raise JobsError(f"{where}: root: {root!r}: {why}")
    return JobSpec(name, collective, ranks, size, float(weight), float(start), root)


def _collective(where: str, value) -> str:
    try:
        name = canonical(str(value))
        spec(name)
    except CompileError:
        from compiler.specs.collectives import COLLECTIVES
        raise JobsError(f"{where}: collective: {value!r} is not a collective (known: {', '.join(COLLECTIVES)})") \
            from None
    return name


def _ranks(where: str, value, topo: Topology) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise JobsError(f"{where}: ranks: {_short(value)} is not a list of GPUs (write them out: [0, 1, 2, 3])")
    if not value:
        raise JobsError(f"{where}: ranks: {_short(value)} is empty; a job needs at least 2 GPUs")
    for r in value:
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < topo.ngpus:
            raise JobsError(f"{where}: ranks: {r!r} is not a GPU of {topo.name} (0..{topo.ngpus - 1})")
    if len(set(value)) != len(value):
        twice = next(r for r in value if value.count(r) > 1)
        raise JobsError(f"{where}: ranks: GPU {twice} is listed twice")
    if len(value) < 2:
        raise JobsError(f"{where}: ranks: {value!r} has one GPU; a collective needs at least 2")
    ranks = tuple(sorted(value))
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[topo.node_of(r)] = per_node.get(topo.node_of(r), 0) + 1
    if len(set(per_node.values())) > 1:
        desc = ", ".join(f"{k} on node {n}" for n, k in sorted(per_node.items()))
        raise JobsError(f"{where}: ranks: {desc}: a job must use the same number of GPUs on every node it spans")
    return ranks


def _size(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise JobsError(f"{where}: size: {value!r} is not a size (examples: 256MB, 1GiB, 4096)")
    try:
        return parse_size(str(value), field="")
    except CompileError as e:
        raise JobsError(f"{where}: size: {e}") from None


def _number(where: str, field: str, value, positive: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise JobsError(f"{where}: {field}: {value!r} must be a number {'> 0' if positive else '>= 0'}")
    return float(value)


def check_together(path: str, jobs: tuple[JobSpec, ...], topo: Topology) -> None:
    """Names are unique; no GPU is in two jobs (jobs may overlap in time, and NCCL, on which every
    MSCCL runtime is built, may deadlock when two communicators run collectives on one GPU at once)."""
    seen_names: set[str] = set()
    owner: dict[int, str] = {}
    for j in jobs:
        if j.name in seen_names:
            raise JobsError(f"{path}: job {j.name!r}: name: used by two jobs (it names the XML file)")
        seen_names.add(j.name)
        for r in j.ranks:
            if r in owner:
                raise JobsError(f"{path}: job {j.name!r}: ranks: GPU {r} is also in job {owner[r]!r}; jobs may run at "
                                "once, and two communicators running collectives on one GPU at once may deadlock "
                                "in NCCL-based MSCCL runtimes")
            owner[r] = j.name
