"""Where the rows come from and how a pass over them runs.

- :mod:`~gpvi.data.sources`: random-access row sources (arrays, ``.npy`` files, Parquet);
- :mod:`~gpvi.data.stream`: minibatch streams for the stochastic engines and ``fit_stream``;
- :mod:`~gpvi.data.executors`: who runs a pass over the blocks of a source (in process or on a
  Dask cluster).
"""
