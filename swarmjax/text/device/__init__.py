"""Text parsed on the device, one sampled token per row per decode tick (jittable,
vmappable; what the jitted swarm runs inside its loop): ``calls`` (the hermes tool-call
parser, its state layout in ``calls_state``, host views for tests and logs in
``call_views``), ``json_parser`` (a byte-at-a-time JSON pushdown automaton) and
``answers`` (``entity: value`` answer lines)."""
