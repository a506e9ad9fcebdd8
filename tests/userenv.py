"""The environment of a child process as a user would start it, without the suite's settings.

tests/conftest.py gives the suite's processes XLA flags that compile faster and, with several
xdist workers, thread limits (BLAS variables, single-threaded Eigen kernels).  Tests whose
subject is XLA's own behaviour (the hang guards) or its exact rounding (stored model files) run
their children with the user's flags and threading instead."""
import os


def user_environment(**extra):
    """``os.environ`` with the user's ``XLA_FLAGS`` back and the thread variables that
    conftest set removed, updated with ``extra``."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = os.environ.get("GPVI_TEST_USER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    for var in filter(None, os.environ.get("GPVI_TEST_SET_THREAD_VARS", "").split(",")):
        env.pop(var, None)
    env.update(extra)
    return env
