import os
import subprocess
import sys

import pytest

# the suite runs one test per core (pytest -n 2): auto's second process would only crowd them (two
# processes per core slow the time-limited searches and the interrupt tests). tests/test_background.py
# asks for two processes where it tests them.
os.environ.setdefault("MSCCL_COMPILE_WORKERS", "1")

from compiler.model.profiles import load_topology


def pytest_configure(config):
    config.addinivalue_line("markers", "long: takes 15 s or more on two cores; collected first")


def pytest_collection_modifyitems(items):
    """Tests marked long first, the rest in their order. Under -n 2, xdist deals tests out in
    collection order, so a two-minute test collected near the end (the README's examples) ran alone
    while the other worker idled: 617 s where the tests' time split evenly would take 570."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def run_cli(*args, cwd=None, timeout=600):
    """Run the installed CLI in a subprocess; returns CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "compiler.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.fixture(scope="session")
def topo():
    cache = {}

    def get(name, nodes=1):
        if (name, nodes) not in cache:
            cache[(name, nodes)] = load_topology(name, nodes)
        return cache[(name, nodes)]
    return get
