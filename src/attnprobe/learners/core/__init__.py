"""What every learner runs on and knows no family: the run skeleton (:mod:`.skeleton`), the typed results
(:mod:`.result`: :class:`Extraction`; :mod:`.check`: :class:`CheckResult` and the functional check;
:mod:`.estimate`: :class:`Estimate`), the registry (:mod:`.registry`: a learner's options, capabilities and
estimate) and what a learner may ask of an oracle (:mod:`.oracle`)."""
