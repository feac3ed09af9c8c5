"""Hybrid sharding (HSDP; Megatron-core's distributed-optimizer instances): ZeRO's states split over
dp_shard·cp ranks and replicated across dp/dp_shard groups (``Layout.dp_shard``). Weights are
gathered over the shard group only; gradients are reduce-scattered over it and their shard
all-reduced across the replicas; every state the shard holds is dp/dp_shard times a full shard."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import comm
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.costs.mesh import members_in_node
from modelcut.core.errors import ModelcutError
from modelcut.core.explore.rules import violations
from modelcut.core.memory import memory_report
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import predict
from modelcut.core.step.data_parallel import dp_collective

EFF = Efficiency(0.75, 0.65, 0.6)
H100 = catalog.hardware("h100")
LLAMA8 = catalog.model("llama3-8b")


def run(dp: int = 32, dp_shard: int | None = None, tp: int = 1, cp: int = 1, pp: int = 1, zero: int = 3,
        gb: int = 64, mb: int = 1) -> Run:
    return Run(LLAMA8, H100.name, Layout(tp=tp, cp=cp, pp=pp, dp=dp, zero=zero, dp_shard=dp_shard,
                                         sequence_parallel=tp > 1),
               Training(seq_len=4096, global_batch=gb, micro_batch=mb))


def step(r: Run, fw: str = "fsdp") -> float:
    return predict(r, H100, "default", efficiency=EFF, framework=catalog.framework(fw)).step_time_s


def peak(r: Run, fw: str = "fsdp") -> float:
    return memory_report(r, H100, framework=catalog.framework(fw))["peak_bytes"]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([(1, 1, 1, 16, 3, "fsdp"), (2, 1, 1, 16, 3, "fsdp"), (1, 2, 1, 8, 3, "fsdp"),
                        (2, 1, 2, 8, 3, "fsdp-compile"), (2, 1, 2, 8, 1, "megatron-core"),
                        (4, 1, 1, 16, 1, "nemo")]))
def test_a_shard_group_of_the_whole_dp_is_todays_model(shape):
    """dp_shard = dp names the default: the same step and the same memory, to the last bit."""
    tp, cp, pp, dp, zero, fw = shape
    a, b = run(dp, None, tp, cp, pp, zero, gb=2 * dp), run(dp, dp, tp, cp, pp, zero, gb=2 * dp)
    assert not b.layout.hybrid
    assert step(a, fw) == step(b, fw)
    assert peak(a, fw) == peak(b, fw)


def test_the_shard_group_is_the_inner_part_of_dp():
    """torchtitan's mesh [..., dp_replicate, dp_shard, cp, tp]: a shard group is dp_shard·cp
    neighbouring data-parallel ranks, a replica group strides over them."""
    L = Layout(tp=2, cp=2, pp=2, dp=8, dp_shard=2)
    m = comm.hybrid_mesh(L)
    assert m.group(0, comm.SHARD) == [0, 2, 4, 6]          # cp 2 × dp_shard 2, tp stride 2
    assert m.group(0, comm.REPLICA) == [0, 8, 16, 24]      # dp/dp_shard = 4 replicas, stride tp·cp·dp_shard
    assert members_in_node(m, comm.SHARD, 8) == 4
    assert members_in_node(m, comm.REPLICA, 8) == 1


def test_collectives_split_over_the_two_groups():
    """All-gather over the shard group; reduce-scatter over it, then the shard's all-reduce across
    the replicas (closed form from the two groups' own collectives)."""
    r = run(dp=32, dp_shard=8)
    L, gpn = r.layout, H100.per_node
    bw = comm.group_bandwidths(L, H100, gpn)
    coll = dp_collective(r, H100, EFF, bw, comm.NCCL_2_9)
    shard, replica = comm.hybrid_groups(L, bw, gpn, comm.NCCL_2_9)
    assert (shard.n, shard.inside, replica.n, replica.inside, replica.per_node) == (8, True, 4, False, 1)
    nbytes = 2.0e9
    assert coll("all-gather", nbytes) == shard.time("all-gather", nbytes, H100, EFF.net, comm.NCCL_2_9)
    assert coll("reduce-scatter", nbytes) == pytest.approx(
        comm.collective("reduce-scatter", 8, nbytes, bw["dp_shard"], H100, shard.alpha, True, EFF.net)
        + comm.collective("all-reduce", 4, nbytes / 8, bw["dp_replica"], H100, replica.alpha, False, EFF.net,
                          per_node=1))
    # PyTorch FSDP's own all-reduce stream: each unit the slower of the two
    piped = dp_collective(r, H100, EFF, bw, comm.NCCL_2_9, replica_stream=True)
    rs = shard.time("reduce-scatter", nbytes, H100, EFF.net, comm.NCCL_2_9)
    ar = replica.time("all-reduce", nbytes / 8, H100, EFF.net, comm.NCCL_2_9)
    assert piped("reduce-scatter", nbytes) == max(rs, ar) < coll("reduce-scatter", nbytes) == pytest.approx(rs + ar)
    assert catalog.framework("fsdp").replica_reduce_stream and catalog.framework("llm-foundry").replica_reduce_stream
    assert not catalog.framework("megatron-core").replica_reduce_stream
    # across nodes the full group's gather moves the same bytes over the network: slower than NVLink's
    full = run(dp=32)
    coll_full = dp_collective(full, H100, EFF, comm.group_bandwidths(full.layout, H100, gpn), comm.NCCL_2_9)
    assert coll("all-gather", nbytes) < coll_full("all-gather", nbytes)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), st.sampled_from(["fsdp", "fsdp-compile"]))
def test_more_sharding_never_needs_more_memory(tc, fw):
    """Each state is split over the shard group: memory falls (or stays) as dp_shard grows."""
    tp, cp = tc
    dp = 32 // (tp * cp) * 2
    peaks = [peak(run(dp, s, tp, cp, gb=dp)) for s in (1, 2, 4, 8, dp)]
    assert all(a >= b for a, b in zip(peaks, peaks[1:]))


def test_states_are_the_full_shard_times_the_replicas():
    """ZeRO-3's gradients and optimizer states held per rank: dp/dp_shard times full sharding's
    (the weights add the gathered 16-bit layers, which do not depend on the sharding)."""
    full = memory_report(run(32, None), H100, framework=catalog.framework("fsdp"))["stages"][0]
    hyb = memory_report(run(32, 8), H100, framework=catalog.framework("fsdp"))["stages"][0]
    for key in ("gradients_bytes", "optimizer_bytes"):
        assert hyb[key] == pytest.approx(4 * full[key])
    assert hyb["activations_bytes"] == full["activations_bytes"]


def test_bad_shards_are_one_line():
    with pytest.raises(ModelcutError, match="dp_shard .3. must divide dp .32."):
        Layout(dp=32, dp_shard=3)
    with pytest.raises(ModelcutError, match="with expert parallelism is not modelled"):
        Layout(dp=32, ep=8, dp_shard=8)
    with pytest.raises(ModelcutError, match="needs sharded data parallelism"):
        step(run(32, 8, zero=0), "megatron-2022")
    with pytest.raises(ModelcutError, match="dp_shard must be at least 1"):
        Layout(dp=8, dp_shard=0)


def test_a_stack_without_hybrid_sharding_says_so():
    caps = catalog.capabilities("llama3")
    assert [v.rule for v in violations(caps, LLAMA8, dp=32, zero=3, dp_shard=8)] == ["hybrid_shard"]
    for name in ("fsdp", "fsdp-compile", "llm-foundry", "megatron-core", "nemo", "megatron-bridge"):
        assert not violations(catalog.capabilities(name), LLAMA8, dp=32,
                              zero=3 if "fsdp" in name or name == "llm-foundry" else 1, dp_shard=8), name


def test_run_files_and_the_cli_take_it(tmp_path):
    f = tmp_path / "hsdp.toml"
    f.write_text('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100"\ngpus = 64\n[layout]\ndp = 64\n'
                 'dp_shard = 8\n[training]\nseq_len = 4096\nglobal_batch = 128\n[settings]\nframework = "fsdp"\n')
    out = subprocess.run([sys.executable, "-m", "modelcut", "predict", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "d 64 sharded 8 × replicated 8" in out.stdout
    js = subprocess.run([sys.executable, "-m", "modelcut", "predict", str(f), "--json"], capture_output=True, text=True)
    lay = __import__("json").loads(js.stdout)["layout"]
    assert (lay["dp"], lay["dp_shard"], lay["zero"], lay["framework"]) == (64, 8, 3, "fsdp")
    f.write_text(f.read_text().replace("dp_shard = 8", "dp_shard = 5"))
    out = subprocess.run([sys.executable, "-m", "modelcut", "predict", str(f)], capture_output=True, text=True)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "dp_shard (5) must divide dp (64)" in out.stderr


def _search(fw: str | None, gpus: int = 4096, mode: str = "default", top: int = 5):
    from modelcut.service.explore import run_explore
    from modelcut.service.explore import explore_request
    from modelcut.service.requests import ExploreInput
    req = explore_request(ExploreInput(model="llama3-8b", gpu="h100", gpus=gpus, seq=8192,
                                       global_batch_tokens=gpus * 2 * 8192, framework=fw, mode=mode, top=top))
    return run_explore(req)


def test_the_explorer_shards_within_a_node_where_the_ring_is_latency_bound():
    """4,096 GPUs of Llama 3 8B under torchtitan: the full ring over 512 nodes pays its latency
    every unit, the practitioner's HSDP over a node's 8 GPUs does not. Every hybrid layout shards
    something (ZeRO ≥ 1), and its launch settings say so."""
    import tomllib
    from modelcut.export.emit import megatron_args, torchtitan_toml
    res = _search("fsdp-compile")
    best = res.layouts[0]
    assert best.structure.dp_shard == 8 and best.run.layout.dp_shard == 8
    hybrid = [e for e in res.layouts if e.structure.dp_shard]
    assert hybrid and all(e.zero >= 1 for e in hybrid)
    par = tomllib.loads(torchtitan_toml(best))["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (8, 512)
    mc = _search("megatron-core", top=1).layouts[0]     # Megatron-core's best there is hybrid too
    assert mc.structure.dp_shard == 8 and mc.zero >= 1
    assert f"--num-distributed-optimizer-instances {mc.structure.dp // 8}" in megatron_args(mc).splitlines()


def test_no_hybrid_layouts_where_the_stack_or_the_mode_has_none():
    for fw, mode in (("llama3", "default"), ("fsdp-compile", "seed")):
        assert not [e for e in _search(fw, gpus=512, mode=mode, top=20).layouts if e.structure.dp_shard], (fw, mode)


def test_the_mesh_shows_the_shard_and_replica_groups():
    """``modelcut mesh --dp-shard``: the groups the step model reduces over, each rank's index in them."""
    from modelcut.service.mesh import mesh_input
    from modelcut.service.requests import MeshInput
    _, out = mesh_input(MeshInput(tp=2, cp=2, pp=2, dp=8, dp_shard=2, rank=5))
    groups = {g["dim"]: g for g in out["groups"]}
    assert groups["dp_shard"]["peers"] == [1, 3, 5, 7] and not groups["dp_shard"]["crosses_nodes"]
    assert groups["dp_replica"]["peers"] == [5, 13, 21, 29] and groups["dp_replica"]["nodes"] == 4
    assert (out["coords"]["dp_shard"], out["coords"]["dp_replica"]) == (1, 0)
    assert out["dims"]["dp_shard"] == "inside" and out["dims"]["dp_replica"] == "across"
    _, plain = mesh_input(MeshInput(tp=2, cp=2, pp=2, dp=8, rank=5))
    assert "dp_shard" not in plain["coords"] and len(plain["groups"]) == len(out["groups"]) - 2


def test_seed_mode_says_it_does_not_shard():
    from modelcut.core.step import predict as step_predict
    p = step_predict(run(32, 8), H100, "seed", eta=0.5)
    assert any("dp_shard 8 not modelled" in n for n in p.notes)
    assert p.step_time_s == step_predict(run(32, None), H100, "seed", eta=0.5).step_time_s
