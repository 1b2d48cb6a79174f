"""Differential fuzzing of the reuse model against the real server (``reusebench fuzz``): generated traffic and
launches for a tiny model of every memory family, each request's expected count held against the measured one,
and a difference shrunk to the smallest case that shows it.

``case`` (what a case is), ``strategies`` (how hypothesis draws one), ``differential`` (one case on a server and
on the model), ``defects`` (server defects it found and named), ``search`` (the search and its shrinking). The
package imports none of them, so that the command line loads without hypothesis.
"""
