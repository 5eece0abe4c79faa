"""Hardware profiles: JSON files (one node each) validated with JSON Schema, composed into a Topology.

A profile names GPUs by local rank and switches by name; links carry GB/s and microseconds. The
loader converts to SI once. `--nodes N` composes N copies of the node and joins every NIC to one
non-blocking network switch; a NIC is modelled as a transmit and a receive switch vertex so that
the GPUs it serves share its bandwidth and cannot use it as a shortcut between themselves.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jsonschema
import networkx as nx

from compiler.model import memory
from compiler.model.costs import DEFAULT_GPU_LINK, runtime_costs
from compiler.specs.errors import ProfileError
from compiler.specs.jsoncheck import field_name, first_error, schema_violation
from compiler.specs.jsonkeys import DuplicateKey, loads, unique_keys
from compiler.model.topology import Link, Nic, Switch, Topology

GB = 1e9
US = 1e-6

# Small synthetic topologies, named like msccl-tools' built-ins: NAME:N (e.g. ring:8).
SYNTHETIC = ("fully-connected", "ring", "line", "star", "hub-and-spoke")
SYNTHETIC_ALIASES = {"fullyconnected": "fully-connected", "hubandspoke": "hub-and-spoke", "switch": "hub-and-spoke"}
SYNTHETIC_BW_GBPS = 25.0
SYNTHETIC_ALPHA_US = 0.7


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    origin: str  # file path, or "builtin" for synthetic ones
    description: str
    ngpus: int
    aliases: tuple[str, ...]


def _schema() -> dict:
    return json.loads(resources.files("hw_profiles").joinpath("schema.json").read_text(encoding="utf-8"))


def _profile_files() -> list:
    files = [f for f in resources.files("hw_profiles").iterdir() if f.name.endswith(".json") and f.name not in ("schema.json", "runtimes.json")]
    return sorted(files, key=lambda f: f.name)


def validate_profile(doc, origin: str) -> dict:
    """Check a profile document; raise ProfileError naming origin, field and value. Returns doc."""
    why = schema_violation(doc, _schema())
    if why is not None:
        raise ProfileError(f"{origin}: {why}")
    n = doc["gpu"]["count"]
    switch_names = [s["name"] for s in doc["switches"]]
    # References are checked with a schema generated for this profile's own ranks and names.
    endpoint = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": n - 1}, {"enum": switch_names or [None]}]}
    refs = {
        "type": "object",
        "properties": {
            "switches": {"items": {"properties": {"name": {"not": {"pattern": "^gpu[0-9]+$"}}}}},
            "links": {"items": {"properties": {"ends": {"items": endpoint}}}},
            "nics": {"items": {"properties": {"gpus": {"items": {"type": "integer", "minimum": 0, "maximum": n - 1}}}}},
        },
    }
    err = first_error(jsonschema.Draft202012Validator(refs), doc)
    if err is not None:
        field = field_name(err.absolute_path)
        if field.startswith("switches"):
            raise ProfileError(f"{origin}: {field}: {err.instance!r} is reserved for GPUs")
        names = ", ".join(switch_names) or "none"
        what = "a GPU rank" if field.startswith("nics") else "a GPU rank or a switch name"
        raise ProfileError(f"{origin}: {field}: {err.instance!r} is not {what} (ranks 0..{n - 1}; switches: {names})")
    _check_unique(doc, origin)
    _check_connected(doc, origin)
    return doc


def _check_unique(doc: dict, origin: str) -> None:
    seen: dict[str, int] = {}
    for i, s in enumerate(doc["switches"]):
        if s["name"] in seen:
            raise ProfileError(f"{origin}: switches[{i}].name: {s['name']!r} duplicates switches[{seen[s['name']]}]")
        seen[s["name"]] = i
    directed: dict[tuple, int] = {}
    for i, l in enumerate(doc["links"]):
        a, b = l["ends"]
        if a == b:
            raise ProfileError(f"{origin}: links[{i}].ends: {l['ends']!r} connects a vertex to itself")
        dirs = [(a, b), (b, a)] if l.get("duplex", True) else [(a, b)]
        for d in dirs:
            if d in directed:
                raise ProfileError(
                    f"{origin}: links[{i}].ends: {l['ends']!r} duplicates links[{directed[d]}] "
                    "(use count for parallel links)")
            directed[d] = i
    owner: dict[int, int] = {}
    for i, nic in enumerate(doc["nics"]):
        for g in nic["gpus"]:
            if g in owner:
                raise ProfileError(f"{origin}: nics[{i}].gpus: GPU {g} is already served by nics[{owner[g]}]")
            owner[g] = i


def _check_connected(doc: dict, origin: str) -> None:
    n = doc["gpu"]["count"]
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for l in doc["links"]:
        a, b = l["ends"]
        g.add_edge(a, b)
        if l.get("duplex", True):
            g.add_edge(b, a)
    reach = nx.descendants(g, 0) | {0}
    back = nx.ancestors(g, 0) | {0}
    for r in range(n):
        if r not in reach or r not in back:
            raise ProfileError(f"{origin}: links: GPU {r} cannot exchange data with GPU 0 (disconnected GPUs)")


# ---- finding profiles -------------------------------------------------------------------------


def list_profiles() -> list[ProfileInfo]:
    infos = []
    for f in _profile_files():
        doc = json.loads(f.read_text(encoding="utf-8"))
        infos.append(ProfileInfo(doc["name"], f.name, doc["description"], doc["gpu"]["count"], tuple(doc.get("aliases", ()))))
    return infos


def synthetic_profile(kind: str, n: int, origin: str) -> dict:
    """A small uniform topology for experiments and tests: 25 GB/s links, 0.7 us per transfer."""
    if n < 2:
        raise ProfileError(f"{origin}: size {n} must be at least 2")
    most = _schema()["properties"]["gpu"]["properties"]["count"]["maximum"]
    if n > most:  # before its links are built: fully-connected:1025 has half a million, and the schema took 85 s
        raise ProfileError(f"{origin}: gpu.count: {n} must be <= {most}")
    bw, al = SYNTHETIC_BW_GBPS, SYNTHETIC_ALPHA_US
    switches: list[dict] = []
    if kind == "fully-connected":
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    elif kind == "ring":
        pairs = [(i, (i + 1) % n) for i in range(n)] if n > 2 else [(0, 1)]
    elif kind == "line":
        pairs = [(i, i + 1) for i in range(n - 1)]
    elif kind == "star":
        pairs = [(0, i) for i in range(1, n)]
    else:  # hub-and-spoke: one non-blocking switch
        switches = [{"name": "switch"}]
        pairs = [(i, "switch") for i in range(n)]
    links = [{"ends": [a, b], "bandwidth_GBps": bw, "alpha_us": al / 2 if switches else al} for a, b in pairs]
    return {
        "name": f"{kind}:{n}",
        "description": f"synthetic {kind} of {n} GPUs, {bw:g} GB/s per link, {al:g} us per transfer",
        "vendor": "other",
        "gpu": {"model": "generic", "count": n, "sms": 80},
        "switches": switches,
        "links": links,
        "nics": [],
        "sources": {"links": "synthetic (msccl-tools-style built-in topology)"},
    }


def load_profile_doc(spec: str) -> tuple[dict, str]:
    """Find a profile by name, alias, NAME:N for synthetic ones, or a file path. Returns (doc, origin)."""
    path = Path(spec)
    if spec.endswith(".json") or "/" in spec or path.is_file():
        if not path.is_file():
            raise ProfileError(f"{spec}: no such profile file")
        try:
            doc = loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
        except json.JSONDecodeError as e:
            raise ProfileError(f"{spec}: not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
        except DuplicateKey as e:
            raise ProfileError(f"{spec}: {e}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ProfileError(f"{spec}: cannot read: {e}") from None
        return validate_profile(doc, spec), spec
    m = re.fullmatch(r"([A-Za-z-]+):([0-9]+)", spec)
    if m:
        kind = SYNTHETIC_ALIASES.get(m.group(1).lower().replace("-", ""), m.group(1).lower())
        if kind not in SYNTHETIC:
            raise ProfileError(f"unknown synthetic topology {m.group(1)!r} (known: {', '.join(SYNTHETIC)})")
        doc = synthetic_profile(kind, int(m.group(2)), f"--hw {spec}")
        return validate_profile(doc, f"--hw {spec}"), "builtin"
    wanted = spec.lower()
    for f in _profile_files():
        doc = json.loads(f.read_text(encoding="utf-8"))
        if wanted == doc["name"].lower() or wanted in (a.lower() for a in doc.get("aliases", ())):
            return validate_profile(doc, f.name), f.name
    known = ", ".join(p.name for p in list_profiles())
    raise ProfileError(f"unknown hardware profile {spec!r} (known: {known}; or NAME:N for {', '.join(SYNTHETIC)}; or a .json file)")


def load_topology(spec: str, nodes: int = 1) -> Topology:
    if not isinstance(nodes, int) or nodes < 1:
        raise ProfileError(f"--nodes: {nodes!r} must be a whole number >= 1")
    doc, origin = load_profile_doc(spec)
    if nodes > 1 and not doc["nics"]:
        raise ProfileError(f"{origin}: nics: [] has no NIC, so --nodes {nodes} cannot join nodes")
    ngpus = doc["gpu"]["count"] * nodes
    links = (2 * len(doc["links"]) + 2 * sum(len(n["gpus"]) + 1 for n in doc["nics"])) * nodes
    memory.require(memory.topology_bytes(ngpus, links),
                      f"--nodes {nodes}: {doc['name']} x {nodes} ({ngpus:,} GPUs, tables over every GPU pair)")
    return compose(doc, nodes)


def compose(doc: dict, nodes: int = 1) -> Topology:
    """N copies of one node's profile; with N > 1 every NIC joins one non-blocking network switch."""
    n = doc["gpu"]["count"]
    names = [s["name"] for s in doc["switches"]]
    switches: list[Switch] = []
    links: list[Link] = []
    nics: list[Nic] = []

    def sw_name(name: str, node: int) -> str:
        return name if nodes == 1 else f"{name}@{node}"

    for node in range(nodes):
        for s in doc["switches"]:
            switches.append(Switch(sw_name(s["name"], node), bool(s.get("multicast", False)), "switch", node))
    sw_count = len(switches)
    vid = {}
    for node in range(nodes):
        for k, name in enumerate(names):
            vid[(node, name)] = nodes * n + node * len(names) + k

    def vertex(end, node: int) -> int:
        return node * n + end if isinstance(end, int) else vid[(node, end)]

    gpu_kind = DEFAULT_GPU_LINK[doc["vendor"]]
    for node in range(nodes):
        for l in doc["links"]:
            a, b = (vertex(e, node) for e in l["ends"])
            bw, al, c, kind = l["bandwidth_GBps"] * GB, l["alpha_us"] * US, l.get("count", 1), l.get("kind", gpu_kind)
            links.append(Link(a, b, bw, al, c, kind))
            if l.get("duplex", True):
                links.append(Link(b, a, bw, al, c, kind))
    if nodes > 1:
        net = nodes * n + sw_count + 2 * nodes * len(doc["nics"])
        for node in range(nodes):
            for k, nic in enumerate(doc["nics"]):
                tx = nodes * n + sw_count + 2 * (node * len(doc["nics"]) + k)
                rx = tx + 1
                switches.append(Switch(f"nic{k}.tx@{node}", False, "nic", node))
                switches.append(Switch(f"nic{k}.rx@{node}", False, "nic", node))
                bw, al = nic["bandwidth_GBps"] * GB, nic["alpha_us"] * US
                gpus = tuple(node * n + g for g in nic["gpus"])
                nics.append(Nic(node, k, gpus, bw, al, tx, rx))
                for g in gpus:
                    links.append(Link(g, tx, bw, 0.0, 1, "network"))
                    links.append(Link(rx, g, bw, 0.0, 1, "network"))
                links.append(Link(tx, net, bw, al / 2, 1, "network"))
                links.append(Link(net, rx, bw, al / 2, 1, "network"))
        switches.append(Switch("network", False, "network", -1))
    else:
        for k, nic in enumerate(doc["nics"]):
            nics.append(Nic(0, k, tuple(nic["gpus"]), nic["bandwidth_GBps"] * GB, nic["alpha_us"] * US))
    links.sort(key=lambda l: (l.src, l.dst))
    return Topology(
        name=doc["name"] if nodes == 1 else f"{doc['name']}x{nodes}",
        ngpus=n * nodes,
        gpus_per_node=n,
        switches=tuple(switches),
        links=tuple(links),
        nics=tuple(nics),
        profile=doc["name"],
        vendor=doc["vendor"],
        gpu_model=doc["gpu"]["model"],
        sms=doc["gpu"]["sms"],
        sources=tuple(sorted(doc["sources"].items())),
        costs=runtime_costs(doc, doc["name"]),
    )
