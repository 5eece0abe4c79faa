import json
import re
from importlib import resources

import pytest

from compiler.specs.errors import ProfileError
from compiler.model.profiles import list_profiles, load_topology
from compiler.model.topology import Topology
from tests.conftest import run_cli

GB = 1e9
REQUIRED = {"dgx1": 8, "ndv2": 8, "dgx2": 16, "dgx-a100": 8, "dgx-h100": 8, "mi250": 8, "mi300x": 8}


def gpu_pairs(t: Topology) -> dict[tuple[int, int], int]:
    return {(l.src, l.dst): l.count for l in t.links if t.is_gpu(l.src) and t.is_gpu(l.dst)}


def test_every_required_profile_ships_with_sources():
    infos = {p.name: p for p in list_profiles()}
    for name, n in REQUIRED.items():
        assert infos[name].ngpus == n
        t = load_topology(name)
        assert t.ngpus == n and dict(t.sources), name
        assert t.gpus_connected()


def test_dgx1_cube_mesh_matches_msccl_tools():
    pairs = gpu_pairs(load_topology("dgx1"))
    double = [(0, 1), (0, 4), (1, 3), (2, 3), (2, 6), (4, 5), (5, 7), (6, 7)]
    single = [(0, 2), (0, 3), (1, 2), (1, 5), (3, 7), (4, 6), (4, 7), (5, 6)]
    for a, b in double:
        assert pairs[(a, b)] == pairs[(b, a)] == 2
    for a, b in single:
        assert pairs[(a, b)] == pairs[(b, a)] == 1
    assert len(pairs) == 32
    t = load_topology("dgx1")
    assert all(t.ingress(g) == t.egress(g) == 150 * GB for g in range(8))


def test_mi250_link_counts_and_package_cut():
    t = load_topology("mi250")
    links_per_gcd = [sum(t.links[i].count for i in t.out_links(g)) for g in range(8)]
    assert links_per_gcd == [7, 6, 7, 6, 7, 6, 7, 6]
    pairs = gpu_pairs(t)
    for pkg in range(4):
        a, b = 2 * pkg, 2 * pkg + 1
        assert pairs[(a, b)] == 4
        outside = sum(c for (x, y), c in pairs.items() if x in (a, b) and y not in (a, b))
        assert outside == 5
    assert all(t.links[i].bandwidth == 50 * GB for i in range(len(t.links)))


def test_mi300x_full_mesh():
    t = load_topology("mi300x")
    pairs = gpu_pairs(t)
    assert len(pairs) == 56 and set(pairs.values()) == {1}
    assert all(t.egress(g) == 7 * 64 * GB for g in range(8))


def test_switch_profiles_per_gpu_bandwidth_and_multicast():
    for name, bw, mc in (("dgx2", 125, False), ("dgx-a100", 300, False), ("dgx-h100", 450, True)):
        t = load_topology(name)
        assert [s.multicast for s in t.switches] == [mc]
        for g in range(t.ngpus):
            assert t.ingress(g) == t.egress(g) == bw * GB
            assert t.neighbours(g) == tuple(x for x in range(t.ngpus) if x != g)
            assert t.path_alpha(t.best_path(g, (g + 1) % t.ngpus)) == pytest.approx(0.7e-6)


def test_two_dgx2_nodes_make_32_gpus_sharing_nics():
    t = load_topology("dgx2", nodes=2)
    assert t.ngpus == 32 and t.nodes == 2
    (path,) = t.paths(1, 16)
    names = [t.vertex_name(v) for v in path]
    assert names == ["gpu1", "nic0.tx@0", "network", "nic0.rx@1", "gpu16"]
    assert t.path_alpha(path) == pytest.approx(2.6e-6)
    assert t.path_bandwidth(path) == 12.5 * GB
    # GPUs 0 and 1 share one 12.5 GB/s transmit side: one link from it into the network
    tx = t.vertex_id("nic0.tx@0")
    assert [t.links[i].dst for i in t.out_links(tx)] == [t.vertex_id("network")]
    assert sorted(t.links[i].src for i in t.in_links(tx)) == [0, 1]
    # a NIC is not a shortcut between the GPUs it serves
    assert t.paths(0, 1)
    assert all(not (len(p) == 3 and t.switch(p[1]).kind == "nic") for p in t.paths(0, 1))


def test_nodes_compose_for_every_profile():
    for name in REQUIRED:
        t = load_topology(name, nodes=3)
        assert t.ngpus == 3 * REQUIRED[name]
        assert t.gpus_connected()


def test_topology_json_round_trip():
    for name, nodes in (("mi250", 1), ("dgx2", 2)):
        t = load_topology(name, nodes)
        assert Topology.from_json(t.to_json()) == t


def test_synthetic_topologies():
    ring = load_topology("ring:6")
    assert ring.neighbours(0) == (1, 5)
    assert load_topology("line:4").neighbours(0) == (1,)
    star = load_topology("star:5")
    assert star.neighbours(3) == (0,) and star.paths(1, 2) == ()
    hub = load_topology("hub-and-spoke:4")
    assert hub.neighbours(0) == (1, 2, 3)
    assert load_topology("FullyConnected:3").neighbours(2) == (0, 1)


def test_a_synthetic_topology_above_the_gpu_limit_is_refused_before_its_links_are_built():
    # fully-connected:1025 built its half a million links and took 85 s to be refused by the schema
    for spec in ("fully-connected:20000", "ring:1025"):
        with pytest.raises(ProfileError, match=f"{spec}: gpu.count: {spec.split(':')[1]} must be <= 1024"):
            load_topology(spec)


def test_aliases_and_user_profile_file(tmp_path):
    assert load_topology("DGX2").ngpus == 16
    assert load_topology("NDv2").nics[0].gpus == tuple(range(8))
    doc = {
        "name": "two", "description": "two GPUs", "vendor": "other", "gpu": {"model": "x", "count": 2, "sms": 10},
        "switches": [], "links": [{"ends": [0, 1], "bandwidth_GBps": 10, "alpha_us": 1}],
        "nics": [], "sources": {"links": "made up"},
    }
    path = tmp_path / "two.json"
    path.write_text(json.dumps(doc))
    t = load_topology(str(path))
    assert t.links[0].bandwidth == 10 * GB and t.links[0].alpha == pytest.approx(1e-6)


BASE = {
    "name": "bad", "description": "d", "vendor": "other", "gpu": {"model": "x", "count": 3, "sms": 10},
    "switches": [{"name": "sw"}],
    "links": [{"ends": [0, "sw"], "bandwidth_GBps": 10, "alpha_us": 1},
              {"ends": [1, "sw"], "bandwidth_GBps": 10, "alpha_us": 1},
              {"ends": [2, "sw"], "bandwidth_GBps": 10, "alpha_us": 1}],
    "nics": [], "sources": {"links": "test"},
}


def mutated(edit):
    doc = json.loads(json.dumps(BASE))
    edit(doc)
    return doc


BROKEN = [
    ("unknown rank", lambda d: d["links"][1].update(ends=[7, "sw"]), "links[1].ends[0]", "7"),
    ("unknown switch", lambda d: d["links"][2].update(ends=[2, "nvs"]), "links[2].ends[1]", "'nvs'"),
    ("non-positive bandwidth", lambda d: d["links"][0].update(bandwidth_GBps=0), "links[0].bandwidth_GBps", "0"),
    ("negative alpha", lambda d: d["links"][2].update(alpha_us=-0.5), "links[2].alpha_us", "-0.5"),
    ("duplicate link", lambda d: d["links"].append({"ends": ["sw", 1], "bandwidth_GBps": 5, "alpha_us": 1}),
     "links[3].ends", "duplicates links[1]"),
    ("disconnected", lambda d: d["links"].pop(), "links", "GPU 2"),
    ("unknown field", lambda d: d["gpu"].update(memory=80), "gpu.memory", "unknown field"),
    ("missing field", lambda d: d.pop("sources"), "sources", "missing"),
    ("nic rank", lambda d: d["nics"].append({"gpus": [3], "bandwidth_GBps": 1, "alpha_us": 1}), "nics[0].gpus[0]", "3"),
    # JSON's Infinity and NaN (and 1e400) passed the schema's bounds; compiles stopped on internal errors
    ("infinite bandwidth", lambda d: d["links"][0].update(bandwidth_GBps=float("inf")), "links[0].bandwidth_GBps",
     "inf is not a finite number"),
    ("NaN alpha", lambda d: d["links"][1].update(alpha_us=float("nan")), "links[1].alpha_us", "nan is not a finite number"),
    ("vanishing bandwidth", lambda d: d["links"][2].update(bandwidth_GBps=1e-300), "links[2].bandwidth_GBps",
     "1e-300 must be >= 0.001"),
    ("huge alpha", lambda d: d["links"][0].update(alpha_us=1e300), "links[0].alpha_us", "must be <= 10000"),
    # a misspelt link kind in a runtime override was accepted and changed nothing
    ("step_us link kind", lambda d: d.update(runtime={"protocols": {"Simple": {"step_us": {"nvlinkk": 5}}}}),
     "runtime.protocols.Simple.step_us", "'nvlinkk'"),
    ("tb_GBps link kind", lambda d: d.update(runtime={"protocols": {"LL": {"tb_GBps": {"nvlnk": 1}}}}),
     "runtime.protocols.LL.tb_GBps", "'nvlnk'"),
]


@pytest.mark.parametrize("what,edit,field,value", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_profile_is_one_clear_line(tmp_path, what, edit, field, value):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(mutated(edit)))
    with pytest.raises(ProfileError) as err:
        load_topology(str(path))
    msg = str(err.value)
    assert msg.startswith(f"{path}: {field}:"), msg
    assert value in msg and "\n" not in msg
    proc = run_cli("profiles", "show", path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert field in proc.stderr


def test_invalid_json_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{ not json")
    proc = run_cli("bound", "allgather", "--hw", path)
    assert proc.returncode == 2 and "not valid JSON: line 1" in proc.stderr and proc.stderr.count("\n") == 1


URL = re.compile(r"https://[^\s;,)]+")
INTERNAL = re.compile(r"§|\.md\b|\[unverified|reference/|te-ccl-model|msccl-xml", re.I)


def shipped_profiles() -> dict[str, dict]:
    files = [f for f in resources.files("hw_profiles").iterdir()
             if f.name.endswith(".json") and f.name not in ("schema.json", "runtimes.json")]
    return {f.name[:-5]: json.loads(f.read_text(encoding="utf-8")) for f in files}


def test_runtime_costs_cite_public_sources_and_every_profile_has_them():
    """The runtime cost model's constants (hw_profiles/runtimes.json) name their public source
    (NCCL's and RCCL's tuning code, the MSCCL kernel) or say they are estimates to calibrate."""
    from compiler.model.costs import generation_doc
    table = json.loads(resources.files("hw_profiles").joinpath("runtimes.json").read_text(encoding="utf-8"))
    for gen in table["generations"]:
        doc = generation_doc(gen, "runtimes.json")
        text = " ".join(doc["sources"].values())
        assert URL.search(text) or "estimate" in text or "assumption" in text, gen
        assert not INTERNAL.search(URL.sub("", text)), gen
        for proto in ("Simple", "LL", "LL128"):
            p = doc["protocols"][proto]
            assert 0 < p["efficiency"] <= 1 and p["iteration_bytes"] > 0 and p["launch_us"] > 0, (gen, proto)
    for name in REQUIRED:
        t = load_topology(name)
        assert t.costs is not None and "Simple" in t.costs.names, name
        assert all(l.kind in ("nvlink", "xgmi", "pcie", "network") for l in t.links), name
    # the simple protocol moves the most per thread block, LL the least, on every generation's GPU links
    for name in REQUIRED:
        costs, kind = load_topology(name).costs, load_topology(name).links[0].kind
        assert costs.protocol("Simple").tb_rate(kind) > costs.protocol("LL").tb_rate(kind)


def test_profiles_cite_public_sources_only():
    """Every shipped profile names public documents (vendor papers, docs, peer papers and code, with a URL)
    for its links, its alphas and, where it has NICs, its NICs; no citation points into files users do not
    have (an internal reference, a section sign, a markdown file outside a URL)."""
    profiles = shipped_profiles()
    assert set(REQUIRED) <= set(profiles)
    for name, doc in profiles.items():
        sources = doc["sources"]
        needed = ["links", "alpha"] + (["nics"] if doc["nics"] else [])
        for key in needed:
            assert URL.search(sources.get(key, "")), f"{name}: sources.{key} cites no public document (no URL)"
        for key, text in sources.items():
            internal = INTERNAL.search(URL.sub("", text))
            assert not internal, f"{name}: sources.{key} cites an internal reference ({internal.group(0)!r}): {text}"


def test_a_key_given_twice_in_a_users_json_file_is_refused(tmp_path):
    """json keeps the last of a key given twice without a word: a link with two bandwidths took the second."""
    text = json.dumps(BASE).replace('"bandwidth_GBps": 10', '"bandwidth_GBps": 10, "bandwidth_GBps": 50', 1)
    (tmp_path / "p.json").write_text(text)
    (tmp_path / "d.json").write_text('{"chunks": [{"from": 0, "to": [1], "to": [2]}]}')
    (tmp_path / "j.json").write_text('{"jobs": [{"collective": "allgather", "ranks": [0, 1], "size": "1MB", '
                                     '"size": "2MB"}]}')
    for args, name, key in ((("bound", "allgather", "--hw", "p.json"), "p.json", "bandwidth_GBps"),
                            (("custom", "--hw", "dgx1", "--demand", "d.json", "--size", "1MB"), "d.json", "to"),
                            (("jobs", "j.json", "--hw", "dgx1", "-o", "out"), "j.json", "size")):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"{name}: key '{key}' appears twice in one object" in proc.stderr, proc.stderr


ONE_GPU_NODE = {
    "name": "one", "description": "one GPU per node", "vendor": "nvidia", "gpu": {"model": "x", "count": 1, "sms": 10},
    "switches": [], "links": [], "nics": [{"gpus": [0], "bandwidth_GBps": 25, "alpha_us": 3}],
    "sources": {"links": "test"},
}


def test_profiles_show_a_node_of_one_gpu(tmp_path):
    """A node of one GPU is a valid profile (--nodes N joins them), but `profiles show` bounded allgather on it
    and failed with "allgather: needs at least 2 ranks"; it shows the node, without bounds."""
    (tmp_path / "one.json").write_text(json.dumps(ONE_GPU_NODE))
    proc = run_cli("profiles", "show", "one.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "one: 1 GPUs" in proc.stdout and "no collective bounds" in proc.stdout
    proc = run_cli("profiles", "show", "one.json", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["bounds"] == {}, proc.stderr
    proc = run_cli("profiles", "show", "one.json", "--nodes", "2", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and set(json.loads(proc.stdout)["bounds"]) == {"allgather", "alltoall"}, proc.stderr


def test_profiles_show_names_each_nics_speed_where_they_differ(tmp_path):
    """The NIC line printed the first NIC's bandwidth and alpha as every NIC's (2 x 50 GB/s for a 50 and a 10)."""
    doc = json.loads(json.dumps(BASE))
    doc["gpu"]["count"] = 2
    doc["links"] = doc["links"][:2]
    doc["nics"] = [{"gpus": [0], "bandwidth_GBps": 50, "alpha_us": 3}, {"gpus": [1], "bandwidth_GBps": 10, "alpha_us": 5}]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    proc = run_cli("profiles", "show", "p.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("NICs per node"))
    assert "50 GB/s" in line and "10 GB/s" in line and "alpha 5 us" in line, line
