"""The operator's tools, apart from the worker: ``operator`` (``botmesh status``,
``botmesh replay``: lag, the journal's summary, offsets moved), ``dlq`` (dead letters
listed, redriven), ``tools`` (demo traffic, send requests, the receipts tail, the journal
read back) and ``tail`` (topics followed from their start in a thread: what ``botmesh
console`` indexes). None of them runs a worker."""
