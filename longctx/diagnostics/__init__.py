"""Context diagnostics (`python -m longctx context`): how much context a trained model uses.

- `axes`: per method, the evaluation knob that sets the available context, changed in place;
- `recl`: the Relative Effective Context Length of Dai et al. (2019) over a group of models;
- `positions`: loss by position within the segment/window and by distance to the document start;
- `figures`: the figures of the three tables.
The command itself is `longctx.commands.context`.
"""
