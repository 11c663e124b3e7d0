"""Environments. ``widesearch``: the wide-search swarm task (config, vocabulary,
reference simulator)."""
