"""From a model and data to a fitted posterior.

- :mod:`~gpvi.fitting.fit`: :func:`~gpvi.fitting.fit.fit`: validate (:mod:`~gpvi.fitting.problem`),
  run the engine (:mod:`~gpvi.fitting.runner`), learn hyperparameters by the strategy the engine
  record and the model call for (:mod:`~gpvi.fitting.hyper`: none, profile L-BFGS-B, the
  collapsed bound (:mod:`~gpvi.fitting.collapsed`), jointly in the engine, or the engine's own
  driver), and return a :class:`~gpvi.fitting.posterior.FitResult`;
- :mod:`~gpvi.fitting.warmstart`: carrying a posterior across hyperparameter changes;
- :mod:`~gpvi.fitting.stream`: :func:`~gpvi.fitting.stream.fit_stream` over minibatches;
- :mod:`~gpvi.fitting.mog`: the mixture-of-Gaussians posterior (Nguyen & Bonilla 2014);
- :mod:`~gpvi.fitting.predict`: predictive moments shared by the result types;
- :mod:`~gpvi.fitting.codec`: components and fitted states as metadata and arrays (model files);
- :mod:`~gpvi.fitting.defaults`: the default model, kernel start and standardisation shared by the
  command line and the scikit-learn estimators.
"""
