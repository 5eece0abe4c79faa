"""In-place programs as other tools write them (msccl-xml.md §10): the output is the input buffer.

The programs below are written by hand in msccl-tools' style: no outofplace/minBytes/maxBytes (so
in-place only), reductions and copies all on `i` with o_chunks="0" (allreduce, reduce-scatter),
or all on `o` with i_chunks="0" (allgather). The verifier and the torch executor judge them by the
runtime's aliasing (compiler.model.demand.inplace_alias); broken variants must be named.
"""

import re

import pytest

from backends.msccl_xml import read_xml
from compiler.model.demand import make_demand
from compiler.specs.collectives import Alias, inplace_alias
from compiler.lowering.lower import alias_map
from compiler.program.verify import verify

from tests.conftest import run_cli

# 4 GPUs, one tb per rank: chunk c is reduced along c+1 -> c+2 -> c+3 -> c (s, rrs, rrs, rrcs),
# then forwarded around the ring (rcs, rcs, r). Everything reads and writes i.
RING_ALLREDUCE = """\
<algo name="ring_allreduce_inplace" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="4" coll="allreduce" inplace="1">
  <gpu id="0" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="1" recv="3" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrcs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="4" type="rcs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="5" type="rcs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="6" type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="4" type="rcs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="5" type="rcs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="6" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="3" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrcs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="4" type="rcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="5" type="rcs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="6" type="r" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="3" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="0" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrcs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="4" type="rcs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="5" type="rcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="6" type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""
# 4 GPUs, LL: each rank sends i[p] to peer p's scratch, adds the three scratch chunks into i[rank]
# in a local tb (re, each waiting for its receive), then sends the sum to every peer, which stores
# it at i[rank] of the sender.
ALLPAIRS_ALLREDUCE_LL = """\
<algo name="allpairs_allreduce_inplace" proto="LL" nchannels="1" nchunksperloop="4" ngpus="4" coll="allreduce" inplace="1">
  <gpu id="0" i_chunks="4" o_chunks="0" s_chunks="3">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="2" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="2" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="3" recv="3" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="3" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="0" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="3" send="-1" recv="-1" chan="0">
      <step s="0" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="0" deps="1" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="1" dstbuf="i" dstoff="0" cnt="1" depid="1" deps="1" hasdep="0"/>
      <step s="2" type="re" srcbuf="s" srcoff="2" dstbuf="i" dstoff="0" cnt="1" depid="2" deps="1" hasdep="1"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="4" o_chunks="0" s_chunks="3">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="2" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="2" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="1" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="3" recv="3" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="3" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="1" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="3" send="-1" recv="-1" chan="0">
      <step s="0" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="1" cnt="1" depid="0" deps="1" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="1" deps="1" hasdep="0"/>
      <step s="2" type="re" srcbuf="s" srcoff="2" dstbuf="i" dstoff="1" cnt="1" depid="2" deps="1" hasdep="1"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="4" o_chunks="0" s_chunks="3">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="2" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="2" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="3" recv="3" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="3" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="2" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="3" send="-1" recv="-1" chan="0">
      <step s="0" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="2" cnt="1" depid="0" deps="1" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="1" dstbuf="i" dstoff="2" cnt="1" depid="1" deps="1" hasdep="0"/>
      <step s="2" type="re" srcbuf="s" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="2" deps="1" hasdep="1"/>
    </tb>
  </gpu>
  <gpu id="3" i_chunks="4" o_chunks="0" s_chunks="3">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="3" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="3" dstbuf="s" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="2" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="2" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="i" srcoff="3" dstbuf="s" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="2" type="s" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="3" deps="2" hasdep="0"/>
      <step s="3" type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="3" send="-1" recv="-1" chan="0">
      <step s="0" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="3" cnt="1" depid="0" deps="1" hasdep="0"/>
      <step s="1" type="re" srcbuf="s" srcoff="1" dstbuf="i" dstoff="3" cnt="1" depid="1" deps="1" hasdep="0"/>
      <step s="2" type="re" srcbuf="s" srcoff="2" dstbuf="i" dstoff="3" cnt="1" depid="2" deps="1" hasdep="1"/>
    </tb>
  </gpu>
</algo>
"""
# 4 GPUs: the input is o[rank] (i_chunks="0"); the chunks go round the ring (s, rcs, rcs, r).
RING_ALLGATHER = """\
<algo name="ring_allgather_inplace" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="4" coll="allgather" inplace="1">
  <gpu id="0" i_chunks="0" o_chunks="4" s_chunks="0">
    <tb id="0" send="1" recv="3" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="0" o_chunks="4" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="0" o_chunks="4" s_chunks="0">
    <tb id="0" send="3" recv="1" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="3" i_chunks="0" o_chunks="4" s_chunks="0">
    <tb id="0" send="0" recv="2" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""
# 4 GPUs: chunk c picks up every rank's i[c] along the ring and ends at rank c's i[c], which is
# its o[0] in place (o_chunks="0").
RING_REDUCESCATTER = """\
<algo name="ring_reducescatter_inplace" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="4" coll="reduce_scatter" inplace="1">
  <gpu id="0" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="1" recv="3" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrc" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrc" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="3" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrc" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="3" i_chunks="4" o_chunks="0" s_chunks="0">
    <tb id="0" send="0" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rrs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="rrc" srcbuf="i" srcoff="3" dstbuf="i" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""

GOOD = {"ring-allreduce": RING_ALLREDUCE, "allpairs-allreduce-ll": ALLPAIRS_ALLREDUCE_LL,
        "ring-allgather": RING_ALLGATHER, "ring-reducescatter": RING_REDUCESCATTER}


def mutate(xml: str, old: str, new: str, count: int = 1) -> str:
    assert xml.count(old) == count, old
    return xml.replace(old, new)


def step(s: int, kind: str, src: str, dst: str, dep: str = 'depid="-1" deps="-1"', hasdep: int = 0) -> str:
    """One step line's attributes, e.g. step(4, "rcs", "i0", "i0")."""
    return (f'<step s="{s}" type="{kind}" srcbuf="{src[0]}" srcoff="{src[1:]}" dstbuf="{dst[0]}" '
            f'dstoff="{dst[1:]}" cnt="1" {dep} hasdep="{hasdep}"/>')


# rank 1 stores the reduced chunk 0 at i[2] instead of i[0]
WRONG_OFFSET = mutate(RING_ALLREDUCE, step(4, "rcs", "i0", "i0"), step(4, "rcs", "i2", "i2"))
# rank 2 never adds what rank 3 sent it (its last re is gone; the waits move to the re before)
MISSING_STEP = ALLPAIRS_ALLREDUCE_LL
for old, new in ((step(2, "re", "s2", "i2", 'depid="2" deps="1"', 1), ""),
                 (step(1, "re", "s1", "i2", 'depid="1" deps="1"', 0), step(1, "re", "s1", "i2", 'depid="1" deps="1"', 1))):
    MISSING_STEP = mutate(MISSING_STEP, old, new)
MISSING_STEP = mutate(MISSING_STEP, step(2, "s", "i2", "i2", 'depid="3" deps="2"'),
                      step(2, "s", "i2", "i2", 'depid="3" deps="1"'), 3)
# rank 1 adds rank 2's contribution (scratch 1) twice and rank 3's never
COUNTED_TWICE = mutate(ALLPAIRS_ALLREDUCE_LL, step(2, "re", "s2", "i1", 'depid="2" deps="1"', 1),
                       step(2, "re", "s1", "i1", 'depid="2" deps="1"', 1))
# rank 2 stores chunk 1 at o[3] (it forwards the right data, but its o[1] stays empty)
WRONG_OFFSET_AG = mutate(RING_ALLGATHER, step(1, "rcs", "o1", "o1"), step(1, "rcs", "o3", "o3"))

BROKEN = {  # name: (xml, rules verify must name, the rank run reports first)
    "wrong-offset": (WRONG_OFFSET, {"postcondition"}, 1),
    "missing-step": (MISSING_STEP, {"postcondition"}, 0),
    "counted-twice": (COUNTED_TWICE, {"double-count", "postcondition"}, 0),
    "wrong-offset-allgather": (WRONG_OFFSET_AG, {"fifo-order", "postcondition"}, 2),
}


def test_one_aliasing_rule():
    assert inplace_alias("allgather", 2, 3, 12) == Alias("i", "o", 6)
    assert inplace_alias("reduce_scatter", 2, 12, 3) == Alias("o", "i", 6)
    for coll in ("allreduce", "broadcast", "reduce", "alltoall"):
        assert inplace_alias(coll, 3, 8, 8) == Alias("i", "o", 0)
    for coll in ("scatter", "gather", "custom"):
        assert inplace_alias(coll, 1, 4, 4) is None
    assert Alias("i", "o", 6).map(("i", 1)) == ("o", 7) and Alias("i", "o", 6).map(("s", 1)) == ("s", 1)
    d = make_demand("allgather", 4, 1 << 20, 2)
    assert alias_map(d, 3)(("i", 1)) == ("o", 7)  # the lowering uses the same rule


@pytest.mark.parametrize("name", GOOD)
def test_tools_style_inplace_programs_verify(name):
    p = read_xml(GOOD[name])
    assert p.inplace and not p.outofplace  # msccl-tools writes no outofplace: in-place calls only
    v = verify(p)
    assert v.ok, v.summary()


@pytest.mark.parametrize("name", GOOD)
def test_tools_style_inplace_programs_cli_verify(tmp_path, name):
    (tmp_path / "p.xml").write_text(GOOD[name])
    proc = run_cli("verify", "p.xml", cwd=tmp_path)
    assert proc.returncode == 0 and "correct" in proc.stdout, proc.stdout + proc.stderr


def test_tools_style_inplace_programs_run_correct(tmp_path):
    from backends.torch_dist import run_local_many
    results = run_local_many([read_xml(x) for x in GOOD.values()], 4, 1 << 12, inplace=True, iters=1)
    assert [r.correct for r in results] == [True] * len(GOOD), [r.summary() for r in results]
    (tmp_path / "p.xml").write_text(RING_ALLREDUCE)
    proc = run_cli("run", "p.xml", "--nprocs", "4", "--inplace", "--iters", "1", cwd=tmp_path)
    assert proc.returncode == 0 and ": correct;" in proc.stdout, proc.stdout + proc.stderr


def test_inplace_only_file_is_not_run_out_of_place(tmp_path):
    (tmp_path / "p.xml").write_text(RING_ALLGATHER)
    proc = run_cli("run", "p.xml", "--nprocs", "4", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "outofplace=0" in proc.stderr and "--inplace" in proc.stderr


@pytest.mark.parametrize("name", BROKEN)
def test_broken_variants_name_the_rule(tmp_path, name):
    xml, want, _ = BROKEN[name]
    v = verify(read_xml(xml))
    assert want <= {f.rule for f in v.findings}, v.summary()
    (tmp_path / "p.xml").write_text(xml)
    proc = run_cli("verify", "p.xml", cwd=tmp_path)
    assert proc.returncode == 1 and all(f"[{r}]" in proc.stdout for r in want), proc.stdout


def test_broken_variants_run_wrong_on_the_right_rank(tmp_path):
    from backends.torch_dist import run_local_many
    results = run_local_many([read_xml(x) for x, _, _ in BROKEN.values()], 4, 1 << 12, inplace=True, iters=1)
    for name, r in zip(BROKEN, results):
        assert not r.correct and r.first_wrong[0] == BROKEN[name][2], (name, r.summary())
    (tmp_path / "p.xml").write_text(WRONG_OFFSET)
    proc = run_cli("run", "p.xml", "--nprocs", "4", "--inplace", "--iters", "1", cwd=tmp_path)
    m = re.search(r"WRONG: \d+ elements differ; first at rank (\d+) output element (\d+)", proc.stdout)
    assert proc.returncode == 1 and m, proc.stdout + proc.stderr
    chunk = (1 << 20) // 4 // 4  # the default --size 1MiB of float32 in nchunksperloop=4 chunks
    assert int(m.group(1)) == 1 and int(m.group(2)) < chunk  # rank 1's chunk 0 never got the sum


def test_findings_name_the_buffer_the_file_uses():
    v = verify(read_xml(WRONG_OFFSET))  # the output lives in i (o_chunks="0")
    assert [f.message for f in v.findings] == [
        "postcondition: rank 1: o[0] (i[0] in place) should hold the sum of i[0] over ranks 0-3, "
        "but holds rank 1's i[0]"]
