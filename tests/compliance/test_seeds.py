"""compliance.seeds: the entry point's environment, each log read back, the success rate."""

import json

import pytest

from compliance import seeds


def _log(path, seed, status, epochs):
    def line(key, value, time_ms, **meta):
        return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": time_ms,
                                         "event_type": "POINT_IN_TIME", "key": key,
                                         "value": value, "metadata": meta})
    lines = [line("submission_benchmark", "ssd", 0), line("seed", seed, 0),
             line("run_start", None, 1000)]
    lines += [line("eval_accuracy", 0.1 * e, 1000 + e, epoch_num=e) for e in epochs]
    lines.append(line("run_stop", None, 3500, status=status))
    path.write_text("\n".join(lines) + "\n")


def test_runs_the_entry_point_and_reads_every_log(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(cmd, env, cwd, check):
        calls.append((cmd, {k: env[k] for k in ("CONFIG", "NEXP", "SEED", "LOGDIR",
                                                 "EXTRA_ARGS")}))
        _log(tmp_path / "result_0.txt", 7, "success", [2, 4])
        _log(tmp_path / "result_1.txt", 8, "aborted", [2, 4, 6])
        # the third run wrote no log

    monkeypatch.setattr(seeds.subprocess, "run", fake_run)
    rc = seeds.main(["ssd", "-n", "3", "--seed", "7", "--logdir", str(tmp_path),
                     "--extra-args", "--device cuda"])
    assert rc == 1
    assert calls[0][0][1].endswith("benchmarks/ssd/run_and_time.sh")
    assert calls[0][1] == {"CONFIG": "cpu_tiny", "NEXP": "3", "SEED": "7",
                           "LOGDIR": str(tmp_path), "EXTRA_ARGS": "--device cuda"}
    out = capsys.readouterr().out
    assert "seed 7: success, last evaluation at epoch 4, 2.5 s" in out
    assert "seed 8: aborted, last evaluation at epoch 6" in out
    assert "seed 9: no log" in out
    assert "ssd: 1 of 3 seeds reached the target" in out


def test_all_successes_exit_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(seeds.subprocess, "run",
                        lambda *a, **k: _log(tmp_path / "result_0.txt", 1, "success", [3]))
    assert seeds.main(["ssd", "-n", "1", "--logdir", str(tmp_path)]) == 0


def test_an_unknown_workload_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no such entry point"):
        seeds.main(["nosuch", "--logdir", str(tmp_path)])
