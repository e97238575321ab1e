"""Every rank sees the torchrun, Open MPI and PYTORCH_EXEC_* environment; -x and --wdir work."""
import json
import os
import socket

from harness import SYSTEM_PYTHON, check, main, run, script, tmpdir

DUMP = script("""#!/usr/bin/python3
import json, os, sys
out = sys.argv[1]
with open(os.path.join(out, "env." + os.environ["RANK"]), "w") as f:
    json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
""", ".py")


def load(out, n):
    ranks = {}
    for r in range(n):
        with open(os.path.join(out, f"env.{r}")) as f:
            ranks[r] = json.load(f)
    return ranks


def test_every_rank_gets_its_identity():
    out = tmpdir()
    n = 5
    r = run(["-n", str(n), SYSTEM_PYTHON, DUMP, out])
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    ranks = load(out, n)
    ports = {ranks[i]["env"]["MASTER_PORT"] for i in ranks}
    ids = {ranks[i]["env"]["PYTORCH_EXEC_JOBID"] for i in ranks}
    check(len(ports) == 1, f"ranks disagree on MASTER_PORT: {ports}")
    check(len(ids) == 1 and len(ids.pop()) >= 8, "ranks disagree on the job id")
    for i, d in ranks.items():
        e = d["env"]
        want = {"RANK": i, "WORLD_SIZE": n, "LOCAL_RANK": i, "LOCAL_WORLD_SIZE": n, "GROUP_RANK": 0,
                "GROUP_WORLD_SIZE": 1, "ROLE_RANK": i, "ROLE_WORLD_SIZE": n,
                "TORCHELASTIC_RESTART_COUNT": 0, "TORCHELASTIC_MAX_RESTARTS": 0,
                "OMPI_COMM_WORLD_RANK": i, "OMPI_COMM_WORLD_SIZE": n, "OMPI_COMM_WORLD_LOCAL_RANK": i,
                "OMPI_COMM_WORLD_LOCAL_SIZE": n, "OMPI_COMM_WORLD_NODE_RANK": 0,
                "PYTORCH_EXEC_GENERATION": 0, "PYTORCH_EXEC_NODEID": 0, "OMP_NUM_THREADS": 1}
        for k, v in want.items():
            check(e.get(k) == str(v), f"rank {i}: {k}={e.get(k)!r}, expected {v}")
        check(e["ROLE_NAME"] == "default", f"ROLE_NAME={e['ROLE_NAME']}")
        check(e["TORCHELASTIC_RUN_ID"] == e["PYTORCH_EXEC_JOBID"], "run id is not the job id")
        check(e["MASTER_ADDR"] == "127.0.0.1", f"MASTER_ADDR={e['MASTER_ADDR']}")
        check("PYTORCH_EXEC_DOMAIN" in e, "no PYTORCH_EXEC_DOMAIN")
        check(e.get("PATH") == os.environ.get("PATH"), "the launching environment was not passed on")
    # The port was free: it can be bound now that the job is over.
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(ports.pop())))
    s.close()


def test_exports_wdir_and_run_id():
    out, wd = tmpdir(), tmpdir()
    env = dict(os.environ, FROM_HERE="here-value", OMP_NUM_THREADS="3")
    r = run(["-n", "2", "-x", "A=1", "-x", "FROM_HERE", "-xB=x=y", "--wdir", wd, "--run-id", "myrun",
             SYSTEM_PYTHON, DUMP, out], env=env)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    for i, d in load(out, 2).items():
        e = d["env"]
        check(e["A"] == "1" and e["B"] == "x=y" and e["FROM_HERE"] == "here-value", f"rank {i}: -x lost")
        check(e["OMP_NUM_THREADS"] == "3", "the user's OMP_NUM_THREADS was overridden")
        check(e["TORCHELASTIC_RUN_ID"] == "myrun", "--run-id ignored")
        check(os.path.realpath(d["cwd"]) == os.path.realpath(wd), f"rank {i} cwd {d['cwd']}")


def test_many_ranks_without_slot_limit():
    n = 3 * (os.cpu_count() or 2) + 1
    r = run(["-n", str(n), "sh", "-c", 'echo "$RANK/$WORLD_SIZE"'])
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
    got = sorted(r.stdout.split())
    check(got == sorted(f"{i}/{n}" for i in range(n)), f"output {got}")


if __name__ == "__main__":
    main([test_every_rank_gets_its_identity, test_exports_wdir_and_run_id,
          test_many_ranks_without_slot_limit])
