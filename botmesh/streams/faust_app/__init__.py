"""Everything of the worker that knows Faust, in one place.

- ``app``: the Faust app (``build_app``, ``run_worker``): its lifecycle, the inbound agent
  handing batches to the ``Pipeline`` and the runner, and the ``Wiring`` that connects the
  app's parts to the engine.
- ``table``: ``JournalTable``, the Faust table under the journal (restore, standbys, the
  changelog records the journal produces, and their transactions under ``exactly_once``).
- ``defects``: the faust-streaming defects the worker meets and what it does about each,
  as a register (``REGISTER``) installed from one entry point.

The rest of ``botmesh.streams`` (the runner, the journal over the table, the retry tiers,
membership, settings) never imports Faust.
"""
