"""scikit-learn estimators (:mod:`~gpvi.sklearn.estimators`) and the damping diagnosis they report
(:mod:`~gpvi.sklearn.damping`).  Importing this package does not import scikit-learn; the
estimators module does.
"""
