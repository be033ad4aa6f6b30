"""The broker's CPU and memory as the whole process tree: a brokerd started
with ``--workers N`` is a supervisor and N worker processes, and the shared
generator samples only the process ``--broker-pid`` names. ``patch(mqttbench)``
makes its samples the sums over that process, its descendants and the
processes listed in ``$BENCH_ALSO_PIDS`` (comma-separated: e.g. the other
nodes of a cluster on this host). The generator is imported, not changed.
"""

import os
import subprocess


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return out


def patch(mqttbench) -> None:
    also = [int(p) for p in os.environ.get("BENCH_ALSO_PIDS", "").split(",") if p.strip()]
    cpu, rss = mqttbench.proc_cpu_s, mqttbench.proc_rss

    def tree(pid):
        return [q for p in (pid, *also) for q in descendants(p)]

    def summed(one):
        def total(pid):
            values = [one(p) for p in tree(pid)]
            values = [v for v in values if v is not None]
            return sum(values) if values else None
        return total

    mqttbench.proc_cpu_s = summed(cpu)
    mqttbench.proc_rss = summed(rss)


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM the broker a bench started and wait for it; SIGKILL past ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
