"""The benchmark scripts run end to end (their --quick smoke versions) and write their outputs.

Timings are not asserted here (tests never time things); only that the scripts work and that
the properties that do not depend on machine load hold.
"""
import math
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env(share_cache=True):
    """The environment of a benchmark process: with ``share_cache``, gpvi's persistent compilation
    cache is the suite's own (conftest.py sets ``GPVI_COMPILATION_CACHE``, which the process
    inherits), so programs that the suite, an earlier benchmark or a benchmark's own child
    processes compiled are loaded instead of compiled again; without it, no cache."""
    env = dict(os.environ)
    if not share_cache:
        env["GPVI_COMPILATION_CACHE"] = "0"
    return env


def _run(script, tmp_path, share_cache=True):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--outdir", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=600, env=_env(share_cache))
    name = script.removesuffix(".py")
    assert (tmp_path / f"{name}_quick.png").stat().st_size > 0
    return json.loads((tmp_path / f"{name}_quick.json").read_text())


@pytest.mark.slow
def test_engines_benchmark_quick(tmp_path):
    out = _run("engines.py", tmp_path)
    for lik, res in out["results"].items():
        fpi = res["median"]["fpi"]
        assert fpi["converged"] and fpi["reached_target"], lik
        assert fpi["iterations_to_target"] <= 15, lik


@pytest.mark.slow
def test_auto_benchmark_quick(tmp_path):
    out = _run("auto.py", tmp_path)
    assert len(out["cells"]) == 7
    for cell in out["cells"]:
        assert cell["converged"]["auto"] and cell["auto_engine"] == "fpi", cell["cell"]
        assert cell["reason"].startswith("engine='auto' chose 'fpi'"), cell["cell"]
        # every certified run ends within the default tolerance (1e-6 relative) of the best VLB
        tol = 1e-6 * max(1.0, abs(cell["best_vlb"]))
        assert all(gap <= tol for e, gap in cell["vlb_below_best"].items() if cell["converged"][e]), cell


@pytest.mark.slow
def test_scale_benchmark_quick(tmp_path):
    out = _run("scale.py", tmp_path)
    assert all(run["converged"] for run in out["runs"])
    assert out["n_ratio"] == 10


@pytest.mark.slow
def test_scale_large_benchmark_quick(tmp_path):
    """The issue-18 runs at smoke size: a Parquet fit in process and on a 2-worker LocalCluster
    give the same VLB, and the L⁻¹-product pass matches the triangular solve."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--large", "--quick", "--outdir",
                    str(tmp_path), "--tmpdir", str(tmp_path)], check=True, capture_output=True, text=True, timeout=600,
                   env=_env())
    out = json.loads((tmp_path / "scale_large_quick.json").read_text())
    assert out["checks"]["dask_vlb_within_1e-10"] and out["checks"]["vlb_within_1e-8_of_triangular_solve"]
    assert out["runs"]["local"]["converged"] and out["runs"]["local"]["passes"] >= 2
    assert (tmp_path / "scale_large_quick.png").stat().st_size > 0


@pytest.mark.slow
def test_conditions_benchmark_quick(tmp_path):
    # Runs without the shared data too (the Fig. 1b/c fits are then skipped).
    out = _run("conditions.py", tmp_path)
    grid = out["grid_results"]
    assert all(r["as_expected"] for r in grid.values()), {k: r["summary"] for k, r in grid.items()}
    assert grid["poisson"]["condition2a"] and not grid["studentt"]["condition1"]
    assert (tmp_path / "conditions_quick.md").read_text().count("| holds |") >= 5
    if (ROOT.parent / "shared" / "data" / "german_numer").is_dir():
        for r in out["fit_results"].values():
            assert r["fraction_increasing"] + r["fraction_decreasing"] + r["fraction_flat"] == pytest.approx(1.0)


@pytest.mark.slow
def test_contraction_benchmark_quick(tmp_path):
    out = _run("contraction.py", tmp_path)  # synthetic data only: no shared data needed
    assert out["checks"]["passed"], out["checks"]  # Gaussian closed form, Poisson brute force, sampler
    assert (tmp_path / "contraction_quick.md").read_text().count("| **") == 3  # one verdict per likelihood
    for lik, rows in out["summary"].items():
        for M, s in rows.items():
            pairs = out["pairs"][lik][M]
            assert s["pairs"] == out["config"]["reps"] == len(pairs["d_in"])
            # Ũ, Ṽ have eigenvalues in (0, 1), so their whitened distance is below 1.
            assert 0 < max(pairs["d_in_w"]) < 1
            assert s["mean_not_converged"] == 0
            ratios = [o / i for o, i in zip(pairs["d_out"], pairs["d_in"])]  # stored to 5 digits
            assert max(ratios) == pytest.approx(s["max_ratio"], rel=1e-3)
    # Count and binary: the paper's claim (and Sheth & Khardon 2016's convergence theory).
    for lik in ("poisson", "bernoulli"):
        assert all(s["fraction_contracting"] == 1.0 for s in out["summary"][lik].values())


@pytest.mark.slow
def test_vlb_time_benchmark_quick(tmp_path):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("needs the shared data sets (../shared/data)")
    out = _run("vlb_time.py", tmp_path)
    md = (tmp_path / "vlb_time_quick.md").read_text()
    assert "FPi reaches the optimum VLB faster than GRAD" in md
    cells = {f"{c['model']}:{c['likelihood']}": c for c in out["cells"]}
    assert set(cells) == {"glm:studentt", "sparse:poisson"}
    for c in cells.values():
        assert "error" not in c, c.get("error")
        assert set(c["runs"]) == {"fpi", "fpb", "gradient", "fpi_seq"}
        assert c["verdict_fpi_grad"] in ("holds", "partly", "does not hold")
        # best = the highest VLB of any trace; every engine improved on the common start
        for r in c["runs"].values():
            tr = r["trace"]
            assert max(row[1] for row in tr) <= c["best_vlb"]
            assert r["final_vlb"] > tr[0][1]
    # Poisson (log-concave, Condition 1 + 2a): fpi converges to the optimum, GRAD agrees closely
    pois = cells["sparse:poisson"]["runs"]
    assert pois["fpi"]["status"] == "converged"
    assert pois["fpi"]["rel_gap"] < 1e-8 and pois["fpb"]["rel_gap"] < 1e-8
    assert pois["gradient"]["rel_gap"] < 1e-4
    # Student-t: γ is clipped in the fp engines' steps, never in GRAD's
    st = cells["glm:studentt"]["runs"]
    assert st["fpi"]["clipped"] > 0 and st["gradient"]["clipped"] == 0
    assert cells["glm:studentt"]["conditions"]["condition1"] is False


@pytest.mark.slow
def test_blogfeedback_benchmark_quick(tmp_path):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("needs the shared data sets (../shared/data)")
    out = _run("blogfeedback.py", tmp_path)
    assert out["problem"]["N"] == 5000 and out["model"]["M"] == 50
    assert out["fpi"]["status"] == "converged"
    # the best VLB is the maximum over both engines' traces, and fpi gets within its tolerance
    assert out["best_vlb"] >= max(out["fpi"]["vlb"], out["gradient"]["vlb"])
    assert out["best_vlb"] - out["fpi"]["vlb"] <= 1e-5 * abs(out["best_vlb"])
    assert out["peak_rss_mb"] > 0
    assert "2709" in (tmp_path / "blogfeedback_quick.md").read_text()


def _run_curves(script, tmp_path):
    """``_run`` with a longer limit: these quick runs are dominated by JAX compilation (seven
    methods × three likelihoods), which takes minutes on a busy 2-core machine."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--outdir", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=1800, env=_env())
    name = script.removesuffix(".py")
    assert (tmp_path / f"{name}_quick.png").stat().st_size > 0
    return json.loads((tmp_path / f"{name}_quick.json").read_text())


def _check_curves(out, learn):
    """Structure and engine-independent properties of a learning_curves/hyperparameters JSON."""
    ok = {"ok", "not converged", "non-finite VLB", "error", "budget exceeded", "n/a", "skipped"}
    tasks = set()
    for name, R in out["results"].items():
        task = R["info"]["task"]
        tasks.add(task)
        assert len(R["sizes"]) == len(out["config"]["sizes"]), name
        for M, S in R["sizes"].items():
            assert len(S["folds"]) == out["config"]["folds"]
            for fold in S["folds"]:
                recs = fold["methods"]
                assert len(recs) == 7
                assert all(r["status"] in ok for r in recs.values())
                # FP and gradient on the sparse model always work on these problems
                for key in ("fpi:sparse", "gradient:sparse", "fpi:sod"):
                    assert recs[key]["status"] == "ok", (name, M, key, recs[key].get("message"))
                    err = recs[key]["error"]
                    assert err is not None and 0.0 <= err and (task == "count" or err <= 1.0)
                    if learn:
                        assert recs[key]["hyperparameters"]["lengthscale"] > 0
                if "dual" in out["engines_available"] and task == "ordinal":
                    assert recs["dual:sparse"]["status"] == "n/a"  # no Fenchel conjugate
                if task == "count" and not learn:
                    # two engines on one concave problem: the same optimum (strong duality)
                    a, b = recs["fpi:sparse"]["vlb"], recs["gradient:sparse"]["vlb"]
                    assert abs(a - b) <= 1e-3 * abs(a)
    assert tasks == {"count", "binary", "ordinal"}
    assert all(c["verdict"] in ("holds", "partly", "does not hold", "not tested") for c in out["claims"])


@pytest.mark.slow
def test_learning_curves_benchmark_quick(tmp_path):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("needs the shared data sets (../shared/data)")
    out = _run_curves("learning_curves.py", tmp_path)
    assert out["config"]["sizes"] == [40] and out["config"]["folds"] == 2
    _check_curves(out, learn=False)
    assert len(out["claims"]) == 5
    # the sparse model sees all training rows: on these data it beats SoD at M = 40
    for name, R in out["results"].items():
        s = R["sizes"]["40"]["summary"]
        assert s["fpi:sparse"]["error"] <= min(s[k]["error"] for k in ("fpi:sod", "gradient:sod")) + 0.02, name
    md = (tmp_path / "learning_curves_quick.md").read_text()
    assert "| claim" in md and "(e) ordinal" in md


@pytest.mark.slow
def test_hyperparameters_benchmark_quick(tmp_path):
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("needs the shared data sets (../shared/data)")
    out = _run_curves("hyperparameters.py", tmp_path)
    _check_curves(out, learn=True)
    # every method learned its own hyperparameters: FP-sparse moved away from the default σ² = 1
    for R in out["results"].values():
        for S in R["sizes"].values():
            for fold in S["folds"]:
                assert fold["methods"]["fpi:sparse"]["hyperparameters"]["variance"] != 1.0
    assert "Fig. 4" in (tmp_path / "hyperparameters_quick.md").read_text()


@pytest.mark.slow
def test_stream_benchmark_quick(tmp_path):
    out = _run("stream.py", tmp_path)
    for r in out["results"]:
        assert len(r["sfp_epochs"]) == 2 and r["fpi_converged"]
        assert min(r["nlpd_rel_diff_per_epoch"]) < 0.02  # sfp from the file is near batch fpi at N = 40 000
    assert (tmp_path / "stream_quick.md").read_text().count("hold") >= 6  # a verdict per claim and likelihood


@pytest.mark.slow
def test_cheng2016_benchmark_quick(tmp_path):
    out = _run("cheng2016.py", tmp_path)
    res = out["results"]
    assert set(res) == {"VSGPR-svi", "iVSGPR5", "iVSGPR10", "iVSGPRada", "VSGPR*-svi"}
    assert all(0 < r["nmse"] < 1.5 and len(r["curve"]) >= 5 for r in res.values())
    assert res["iVSGPR5"]["subproblem_evaluations"][0] >= 5 and res["VSGPR-svi"]["subproblem_evaluations"][0] == 0
    # learning θ and Z online beats keeping the starting ones (Table 1a's first claim)
    assert res["iVSGPR10"]["nmse"] < res["VSGPR-svi"]["nmse"]
    assert all(c["verdict"] for c in out["claims"])
    assert (tmp_path / "cheng2016_quick.md").stat().st_size > 0


@pytest.mark.slow
def test_izmailov2017_benchmark_quick(tmp_path):
    if not (ROOT.parent / "shared" / "data" / "german_numer").is_dir() and "GPVI_DATA_DIR" not in __import__("os").environ:
        pytest.skip("shared data sets not available")
    out = _run("izmailov2017.py", tmp_path)
    assert set(out["results"]) == {"german_numer", "svmguide1"}
    for name, res in out["results"].items():
        for engine in ("jj", "taylor", "jj-hybrid", "jj-full", "fpi"):
            curve = res["methods"][engine]
            assert len(curve["times"]) == len(curve["accuracy"]) >= 1
            assert curve["accuracy"][-1] > 0.6, (name, engine)
        assert res["fixed_theta"]["jj_true_vlb"] <= res["fixed_theta"]["fpi_vlb"] + 1e-6
        for engine in ("jj", "taylor", "jj-hybrid", "jj-full"):
            assert res["methods"][engine]["surrogate_bound"] <= res["methods"][engine]["final_vlb"] + 1e-6 \
                or engine == "taylor"  # the Taylor expansion is not a bound
    verdicts = {r["verdict"] for r in out["claims"]}
    assert verdicts <= {"holds", "partly", "does not hold", "not run (svi not merged yet)"}
    assert (tmp_path / "izmailov2017_quick.md").read_text().count("| german_numer |") >= 3
    # the M sweep, merged into the comparison, gives a saturation claim for the swept set
    script = str(ROOT / "benchmarks" / "izmailov2017.py")
    sweep_dir, merged_dir = tmp_path / "sweep", tmp_path / "merged"
    subprocess.run([sys.executable, script, "--quick", "--m-sweep", "--datasets", "german_numer", "--outdir",
                    str(sweep_dir)], check=True, capture_output=True, text=True, timeout=600, env=_env())
    sweep = json.loads((sweep_dir / "izmailov2017_quick_msweep.json").read_text())["m_sweep"]["german_numer"]
    assert [p["M"] for p in sweep] == [5, 10, 20]
    assert all(0.5 < p["accuracy"] <= 1 and math.isfinite(p["vlb"]) for p in sweep)
    subprocess.run([sys.executable, script, "--quick", "--outdir", str(merged_dir), "--merge",
                    str(tmp_path / "izmailov2017_quick.json"), str(sweep_dir / "izmailov2017_quick_msweep.json")],
                   check=True, capture_output=True, text=True, timeout=600, env=_env())
    merged = json.loads((merged_dir / "izmailov2017_quick.json").read_text())
    sat = [r for r in merged["claims"] if r["claim"].startswith("ours: M = 10 saturates")]
    assert len(sat) == 1 and sat[0]["dataset"] == "german_numer"
    assert sat[0]["verdict"] in {"holds", "partly", "does not hold"}


def test_izmailov2017_merges_an_svi_only_grid():
    """An ``--svi-only`` run's rates join the comparison run's svi grid, and svi's row is then the
    rate that first reaches the grid's best accuracy (−0.5 %); an svi-only run of another batch
    size is refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import izmailov2017 as B
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def curve(times, accs):
        return {"times": times, "accuracy": accs}

    base = {"N": 100, "M": 10, "batch_size": 50, "methods": {}, "svi_grid": {"curves": {
        "0.1": curve([1.0, 2.0], [0.60, 0.70]), "1.0": curve([1.0, 2.0], [0.70, 0.80])}}}
    B.choose_svi(base)
    assert base["svi_grid"]["chosen"] == 1.0
    results = {"a": base}
    extra = {"N": 100, "M": 10, "batch_size": 50, "svi_only": True, "methods": {},
             "svi_grid": {"curves": {"3.0": curve([1.0, 2.0], [0.798, 0.81])}}}
    B.merge_results(results, {"a": extra})
    grid = results["a"]["svi_grid"]
    assert grid["rates"] == [0.1, 1.0, 3.0] and grid["chosen"] == 3.0  # the only rate to reach 0.81 − 0.005
    assert results["a"]["methods"]["svi"] is grid["curves"]["3.0"]
    with pytest.raises(ValueError, match="batch size"):
        B.merge_results(results, {"a": dict(extra, batch_size=25)})


@pytest.mark.slow
def test_everyday_benchmark_quick(tmp_path):
    out = _run("everyday.py", tmp_path, share_cache=False)  # its first split must pay the compilation
    rows = {r["name"]: r for r in out["summary"]}
    assert set(rows) == {"breast_cancer", "diabetes"}
    assert rows["breast_cancer"]["gpvi_metric"] < 0.2  # error rate of the default classifier
    # the second split has the first's training size: its fit reuses the compiled programs
    assert rows["breast_cancer"]["later_over_first"] < 1.0


@pytest.mark.slow
def test_first_fit_benchmark_quick(tmp_path):
    out = _run("first_fit.py", tmp_path)
    assert set(out["runs"]) == {"after, cache off", "after, empty cache", "after, filled cache (new process)"}
    for run in out["runs"].values():
        assert len(run["regression_full"]) == len(run["classification_sparse"]) == 2


@pytest.mark.slow
def test_nguyen2014_benchmark_quick(tmp_path):
    out = _run("nguyen2014.py", tmp_path)
    claims = {c["claim"]: c for c in out["claims"]}
    assert len(claims) >= 8
    res = out["results"]
    assert set(res) == {"boston", "creep", "abalone", "breast_cancer", "usps", "mining"}
    # properties that do not depend on machine load: the Monte Carlo FULL agrees with quadrature
    bc = res["breast_cancer"][0]
    assert abs(bc["FULL-MC"]["error"] - bc["FULL"]["error"]) <= 0.01
    assert res["usps"]["fixed"]["error"] < 0.2


@pytest.mark.slow
def test_small_benchmark_quick(tmp_path):
    """Issue 32's benchmark at smoke size (iris and diabetes, 60 training rows).  Its cold-cache
    column uses an empty compilation-cache directory of its own whatever the shared cache is."""
    out = _run("small.py", tmp_path, share_cache=True)
    rows = {r["name"]: r for r in out["results"]}
    assert set(rows) == {"iris", "diabetes"}

    def finite(x):
        return x is not None and math.isfinite(x) and x >= 0

    for name, r in rows.items():
        assert r["errors"] == {}, (name, r["errors"])
        assert r["n_train"] == 60, name
        g, sk = r["gpvi"], r["sklearn"]
        for key in ("import_s", "import_cold_s", "first_fit_cold_s", "first_fit_warm_s", "second_fit_s",
                    "predict_s", "cv3_s", "cv3_cold_cache_s"):
            assert finite(g[key]), (name, key, g[key])
        for key in ("iterations", "evaluations", "hyperparameter_rounds", "backtracks"):
            assert isinstance(g[key], int) and g[key] >= 0, (name, key, g[key])
        assert isinstance(g["warnings"], list) and all(isinstance(w, str) for w in g["warnings"])
        assert finite(sk["import_s"])
        for key in ("fit_s", "second_fit_s", "predict_s", "cv3_s"):
            assert finite(sk["iso"][key]), (name, key)
        assert finite(sk["ard"].get("fit_s")) or sk["ard"]["skipped"].startswith("skipped")
        for m in (g["metrics"], sk["iso"]["metrics"]):
            assert m["nlpd"] is not None and math.isfinite(m["nlpd"])  # a Gaussian NLPD may be negative
            if r["task"] == "classification":
                assert 0.0 <= m["error"] <= 1.0 and m["proba_row_sum_max_dev"] < 1e-6
            else:
                assert finite(m["rmse"])
        assert set(r["targets"]) == {"second_fit", "first_fit_warm", "first_fit_cold", "import", "cv3"}
        assert all(t["ok"] in (True, False) for k, t in r["targets"].items() if k != "cv3"), r["targets"]
    assert rows["iris"]["gpvi"]["metrics"]["error"] < 0.2
    assert rows["iris"]["targets"]["cv3"]["ok"] in (True, False) and rows["diabetes"]["targets"]["cv3"]["ok"] is None
    assert "Targets" in (tmp_path / "small_quick.md").read_text()


@pytest.mark.slow
def test_hard_benchmark_quick(tmp_path):
    out = _run("hard.py", tmp_path)
    # the three quick problems: fpi converges on each (the rescue and the finite start included)
    assert out["converged"]["fpi"] == 3
    assert out["converged_below_best"] == []
