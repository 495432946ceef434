"""The contracts data parallelism needs, between processes on the CPU:
share="node" (one node-local server for the local ranks, started by the
first, ended after the last, a dead rank not stopping the others), every
sample once across ranks, the same number of batches on every rank, and
set_epoch reshuffling every rank alike. Sample k's bytes encode k."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

import gpufeed
from conftest import N_SAMPLES, ROOT, index_of, python_path

CHILD = r"""
import json, os, signal, sys, time
import gpufeed
from conftest import index_of
path, epochs, die_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
loader = gpufeed.Loader(path, batch_size=32, order="block", seed=3, threads=2, prefetch=2, shuffle_window=2,
                        output="numpy")
# A barrier, as DDP's init_process_group is: every rank has attached before
# any reads. Without it a rank that starts late (a loaded machine) finds a
# first rank already done, its server gone, and starts one of its own.
node_dir, world = os.environ["GPUFEED_NODE_DIR"], int(os.environ["WORLD_SIZE"])
open(os.path.join(node_dir, "rank%s.ready" % os.environ["RANK"]), "w").close()
deadline = time.time() + 120
while sum(os.path.exists(os.path.join(node_dir, "rank%d.ready" % r)) for r in range(world)) < world:
    assert time.time() < deadline, "another rank never attached"
    time.sleep(0.01)
out = {"share": loader.share, "started_here": loader.started_node_server,
       "batches": len(loader), "epochs": []}
for epoch in range(epochs):
    loader.set_epoch(epoch)
    got, n = [], 0
    for images, labels in loader:
        got += [index_of(row) for row in images]
        n += 1
        if die_after and n == die_after:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # a rank that dies mid-epoch
    out["epochs"].append({"indices": got, "batches": n})
loader.close()
print(json.dumps(out))
"""


def spawn_ranks(world, node_dir, argv_of_rank, local_world=None, extra_env=None):
    """`world` processes with torchrun's environment for one job on one host
    (`local_world` local ranks, default all), each running
    `argv_of_rank(rank)` with this interpreter."""
    run_id = uuid.uuid4().hex
    procs = []
    for r in range(world):
        env = dict(os.environ)
        env["PYTHONPATH"] = python_path(ROOT / "tests" / "python")
        env.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": str(world if local_world is None else local_world),
                    "TORCHELASTIC_RUN_ID": run_id, "GPUFEED_NODE_DIR": str(node_dir)})
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable] + argv_of_rank(r), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def start_ranks(path, world, node_dir, epochs=2, die_after=None, extra_env=None):
    return spawn_ranks(world, node_dir, lambda r: ["-c", CHILD, path, str(epochs), str((die_after or {}).get(r, 0))],
                       extra_env=extra_env)


def finish(procs, timeout=180):
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append((p.returncode, out, err))
    return results


def server_processes(node_dir):
    """PIDs of `gpufeed serve` processes whose lease lies in node_dir."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and any(a.startswith(str(node_dir).encode()) for a in argv):
            with open("/proc/%s/stat" % d) as f:
                if f.read().split(")")[-1].split()[0] != "Z":
                    pids.append(int(d))
    return pids


def wait_no_server(node_dir, timeout=20):
    deadline = time.time() + timeout
    while server_processes(node_dir):
        assert time.time() < deadline, "the node's server outlived every rank: %s" % server_processes(node_dir)
        time.sleep(0.1)
    assert not [f for f in os.listdir(node_dir) if f.endswith(".sock")], os.listdir(node_dir)


def test_node_share_every_sample_once_one_server(index_file, tmp_path, gpufeed_cli):
    procs = start_ranks(index_file, 2, tmp_path, extra_env={"GPUFEED_CLI": gpufeed_cli})
    results = finish(procs)
    outs = []
    for code, out, err in results:
        assert code == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["share"] for o in outs] == ["node", "node"]
    assert sum(o["started_here"] for o in outs) == 1, "one rank starts the node's server, the other attaches"
    assert len(set(o["batches"] for o in outs)) == 1
    for epoch in range(2):
        per_rank = [o["epochs"][epoch]["indices"] for o in outs]
        assert [o["epochs"][epoch]["batches"] for o in outs] == [outs[0]["batches"]] * 2
        seen = np.bincount(np.concatenate(per_rank), minlength=N_SAMPLES)
        assert (seen == 1).all(), "epoch %d: missing %s, doubled %s" % (
            epoch, np.flatnonzero(seen == 0)[:5], np.flatnonzero(seen > 1)[:5])
        # The same shard a local loader of that rank delivers: the order is
        # the loader's, wherever it runs.
        for r in range(2):
            local = gpufeed.Loader(index_file, batch_size=32, order="block", seed=3, threads=2, shuffle_window=2,
                                   rank=r, world_size=2, share="none", output="numpy")
            local.set_epoch(epoch)
            assert [index_of(row) for images, _ in local for row in images] == per_rank[r]
            local.close()
    # set_epoch reshuffles every rank alike: epoch 2's shards differ from epoch 1's.
    assert outs[0]["epochs"][0]["indices"] != outs[0]["epochs"][1]["indices"]
    wait_no_server(tmp_path)


def test_a_dead_rank_does_not_stop_the_others(index_file, tmp_path, gpufeed_cli):
    procs = start_ranks(index_file, 2, tmp_path, die_after={1: 1}, extra_env={"GPUFEED_CLI": gpufeed_cli})
    (code0, out0, err0), (code1, _, _) = finish(procs)
    assert code1 == -signal.SIGKILL
    assert code0 == 0, err0
    out = json.loads(out0.strip().splitlines()[-1])
    for epoch in out["epochs"]:
        assert epoch["batches"] == out["batches"]
        assert len(epoch["indices"]) == N_SAMPLES // 2
    wait_no_server(tmp_path)


def test_uneven_shards_pad_to_equal_batches(tmp_path, gpufeed_cli):
    from conftest import write_index_file
    path = write_index_file(tmp_path / "odd.h5", n=N_SAMPLES + 1)  # 251 over 2 ranks: one padded row
    procs = start_ranks(path, 2, tmp_path, epochs=1, extra_env={"GPUFEED_CLI": gpufeed_cli})
    outs = []
    for code, out, err in finish(procs):
        assert code == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    indices = [o["epochs"][0]["indices"] for o in outs]
    assert len(indices[0]) == len(indices[1]) == 126
    assert outs[0]["epochs"][0]["batches"] == outs[1]["epochs"][0]["batches"]
    seen = np.bincount(np.concatenate(indices), minlength=N_SAMPLES + 1)
    assert (seen >= 1).all() and seen.sum() == 252 and (seen == 2).sum() == 1
    wait_no_server(tmp_path)


def test_share_options_are_checked(index_file, monkeypatch):
    with pytest.raises(gpufeed.InvalidArgumentError, match="share 'bogus'"):
        gpufeed.Loader(index_file, share="bogus")
    with pytest.raises(gpufeed.InvalidArgumentError, match="cannot pass labels"):
        gpufeed.Loader(index_file, share="node", labels="/labels")
    with pytest.raises(gpufeed.InvalidArgumentError, match="daemon already"):
        gpufeed.Loader("unix:/nonexistent.sock", share="node")
    # auto: a local loader outside torchrun, and where a local-only option is given.
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    loader = gpufeed.Loader(index_file, threads=2)
    assert loader.share == "none"
    loader.close()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    loader = gpufeed.Loader(index_file, threads=2, labels="/labels")
    assert loader.share == "none"
    loader.close()


def test_node_server_that_cannot_start_names_why(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_NODE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", uuid.uuid4().hex)
    with pytest.raises(gpufeed.Error, match="node's server"):
        gpufeed.Loader(str(tmp_path / "missing.h5"), share="node")
    wait_no_server(tmp_path)


RESUME_CHILD = r"""
import json, pickle, sys
import gpufeed
from conftest import index_of
path, what, arg = sys.argv[1], sys.argv[2], sys.argv[3]
loader = gpufeed.Loader(path, batch_size=16, order="block", seed=9, threads=2, prefetch=2, shuffle_window=2,
                        output="numpy")
loader.set_epoch(1)
got, n = [], 0
if what == "save":  # read `arg` batches of epoch 1, then save
    for images, labels in loader:
        got += [index_of(row) for row in images]
        n += 1
        if n == int(arg):
            break
    out = {"indices": got, "state": pickle.dumps(loader.state_dict()).hex(), "share": loader.share}
else:  # resume from the state, to the epoch's end
    loader.load_state_dict(pickle.loads(bytes.fromhex(arg)))
    for images, labels in loader:
        got += [index_of(row) for row in images]
        n += 1
    out = {"indices": got, "batches": n, "share": loader.share}
loader.close()
print(json.dumps(out))
"""


def run_ranks(script, world, node_dir, args, gpufeed_cli, share_env="node"):
    procs = spawn_ranks(world, node_dir, lambda r: ["-c", script] + list(args),
                        local_world=world if share_env == "node" else 1, extra_env={"GPUFEED_CLI": gpufeed_cli})
    outs = []
    for code, out, err in finish(procs):
        assert code == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("save_world,resume_world,resume_share", [(2, 3, "node"), (2, 1, "none"), (3, 2, "none")])
def test_resume_at_another_world_size(index_file, tmp_path, gpufeed_cli, save_world, resume_world, resume_share):
    saved = run_ranks(RESUME_CHILD, save_world, tmp_path, [index_file, "save", "3"], gpufeed_cli)
    assert all(o["share"] == "node" for o in saved) if save_world > 1 else True
    first = np.concatenate([o["indices"] for o in saved])
    resumed = run_ranks(RESUME_CHILD, resume_world, tmp_path, [index_file, "resume", saved[0]["state"]], gpufeed_cli,
                        share_env=resume_share)
    assert all(o["share"] == (resume_share if resume_world > 1 else "none") for o in resumed)
    assert len(set(o["batches"] for o in resumed)) == 1, "every rank the same number of batches"
    rest = np.concatenate([o["indices"] for o in resumed])
    left = N_SAMPLES - len(first)
    padding = resume_world * -(-left // resume_world) - left
    seen = np.bincount(np.concatenate([first, rest]), minlength=N_SAMPLES)
    assert (seen >= 1).all(), "lost: %s" % np.flatnonzero(seen == 0)[:10]
    assert seen.sum() - N_SAMPLES == padding, "repeated beyond the resumed run's padding: %s" % np.flatnonzero(
        seen > 1)[:10]
    wait_no_server(tmp_path)
