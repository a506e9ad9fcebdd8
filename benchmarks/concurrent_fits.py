"""Two ``gpvi.fit`` calls in two threads of one process vs the same calls in a row (issue 14, B8).

Full GP, Bernoulli, hyperparameters learned, two data sets of N points.  Both ways are timed in
the same process after a warm-up (compilation) run; the script also checks that the concurrent
results equal the sequential ones and that the BLAS thread limit is back to its original value.

    python benchmarks/concurrent_fits.py                  # N = 400
    python benchmarks/concurrent_fits.py --per-call-limit # the limiter before the fix, to compare

``--per-call-limit`` swaps in the old per-call ``threadpool_limits(1)`` / restore: with it, after
the warm-up in the main thread, the fits in worker threads ran with OpenBLAS unlimited.
"""
import argparse
import sys
import threading
import time

import numpy as np
from scipy.special import expit
from threadpoolctl import threadpool_info, threadpool_limits

import gpvi


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--per-call-limit", action="store_true", help="use the limiter of before the fix")
    args = ap.parse_args()
    if args.per_call_limit:
        class PerCall:
            def acquire(self):
                return threadpool_limits(limits=1, user_api="blas").restore_original_limits

        sys.modules["gpvi.fitting.runner"].BLAS_LIMIT = PerCall()

    def data(seed):
        rng = np.random.default_rng(seed)
        X = rng.uniform(-3, 3, (args.n, 1))
        return X, (rng.uniform(size=args.n) < expit(2 * np.sin(X[:, 0]))).astype(int)

    problems = [data(1), data(2)]

    def one(i, out):
        X, y = problems[i]
        model = gpvi.GP(gpvi.kernels.RBF(), gpvi.likelihoods.Bernoulli())
        out[i] = gpvi.fit(model, X, y, learn_hyperparameters=True)

    def blas():
        return sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})

    before = blas()
    warm = {}
    for i in range(2):
        one(i, warm)
    t = time.perf_counter()
    seq = {}
    for i in range(2):
        one(i, seq)
    t_seq = time.perf_counter() - t
    con = {}
    threads = [threading.Thread(target=one, args=(i, con)) for i in range(2)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t_con = time.perf_counter() - t
    diff = max(max(float(np.max(np.abs(np.asarray(seq[i].state.mean) - np.asarray(con[i].state.mean)))),
                   abs(seq[i].vlb - con[i].vlb)) for i in range(2))
    print(f"N = {args.n}, limiter: {'per call (before the fix)' if args.per_call_limit else 'shared'}; "
          f"L-BFGS-B rounds {[seq[i].hyperparameter_rounds for i in range(2)]}")
    print(f"sequential {t_seq:.2f} s, two threads {t_con:.2f} s (ratio {t_con / t_seq:.2f}); "
          f"largest |difference| of the results {diff:.1e}; BLAS threads {before} before, {blas()} after")


if __name__ == "__main__":
    main()
