"""Apply a layout recommendation to the bundled serving stack, live and guarded (issue 22, items 3-4).

- :mod:`~phaselens.apply.plan`: the recommendation and the stack's layout → ordered, bounded steps;
- :mod:`~phaselens.apply.stack`: the stack's control API and the reads the guard uses;
- :mod:`~phaselens.apply.guard`: a window's figures, the SLO/error verdict, realised vs predicted;
- :mod:`~phaselens.apply.runner`: dry run or execute, guard windows, rollback (:class:`ApplyRun`,
  :func:`rollback_apply`);
- :mod:`~phaselens.apply.audit`: the ``actions`` rows and the recommendation's status;
- :mod:`~phaselens.apply.policy`: the opt-in auto-apply job of the service.

docs/RECOMMENDATIONS.md, "Apply, guard and auto-apply", describes the behaviour.
"""
