"""Quick start: a Poisson sparse GP on generated counts, fitted with fpi and gradient."""
import time

import numpy as np

import gpvi


def main():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (5000, 1))
    y = rng.poisson(np.exp(np.sin(2 * X[:, 0]) + 0.5))
    Xtest = rng.uniform(-3, 3, (1000, 1))
    ytest = rng.poisson(np.exp(np.sin(2 * Xtest[:, 0]) + 0.5))
    model = gpvi.SparseGP(kernel=gpvi.kernels.RBF(variance=1.0, lengthscale=1.0),
                          likelihood=gpvi.likelihoods.Poisson(), inducing=30).initialise(X)
    print(f"{'engine':<10}{'iterations':>11}{'VLB (nats)':>14}{'test MAE':>10}{'test NLPD':>11}{'seconds':>9}")
    for engine in ["fpi", "gradient"]:
        gpvi.fit(model, X, y, engine=engine, max_iter=3)  # compile once, so timings compare engines
        t = time.perf_counter()
        fit = gpvi.fit(model, X, y, engine=engine, tol=1e-8, max_iter=2000)
        secs = time.perf_counter() - t
        mean, _ = fit.predict_y(Xtest)
        nlpd = gpvi.metrics.nlpd(fit.log_predictive_density(Xtest, ytest))
        print(f"{engine:<10}{fit.iterations:>11}{fit.vlb:>14.3f}{gpvi.metrics.mae(ytest, mean):>10.3f}"
              f"{nlpd:>11.3f}{secs:>9.2f}")


if __name__ == "__main__":
    main()
