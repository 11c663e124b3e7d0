"""The tool graph and its communities: which generated tools form an environment.

Nodes are tools (:class:`~swarmjax.envs.synth.world.ToolSpec`, by name). Edges
(``networkx.DiGraph``; each edge has ``io`` pairs and a ``weight``):

* **io** A -> B when an output of A fills an input of B by type and entity
  (:func:`~swarmjax.envs.synth.world.fits`: ``get_order``'s ``customer_id`` fills
  ``get_customer``; a ``weight`` in kg fills ``convert_kg_to_lb``), weight 1;
* **similar** A <-> B when their descriptions' TF-IDF cosine is at least ``threshold``
  (the same operation on the same noun in two domains), weight the cosine.

Environments are the graph's Louvain communities (``networkx.community.
louvain_communities`` on the undirected weighted graph, seeded): tools that call into
each other end up together, so a community is a domain with its utilities, or
several domains whose tools are alike. :func:`graph_stats` reports what a data set
card states (nodes, edges of each kind, communities, modularity, purity: the share of
tools whose community's most common domain is their own).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np

from swarmjax.envs.synth.world import Kind, ToolSpec, fits, slots, words


def description_similarity(tools: Sequence[ToolSpec]) -> np.ndarray:
    """Cosine similarity [N, N] of the tools' descriptions as TF-IDF vectors
    (``tf * log(N / df)`` over :func:`~swarmjax.envs.synth.world.words`, L2-normalised).
    Written out (a few lines of numpy) rather than taking scikit-learn as a dependency
    for one vectoriser."""
    docs = [words(t.description) for t in tools]
    vocab = {w: i for i, w in enumerate(sorted({w for d in docs for w in d}))}
    tf = np.zeros((len(docs), len(vocab)), np.float32)         # [N, W]
    for i, d in enumerate(docs):
        for w in d:
            tf[i, vocab[w]] += 1
    idf = np.log(len(docs) / np.maximum((tf > 0).sum(0), 1)).astype(np.float32)      # [W]
    x = tf * idf
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)
    return x @ x.T


def tool_graph(tools: Sequence[ToolSpec], kinds: Mapping[str, Kind], *, threshold: float = 0.6) -> nx.DiGraph:
    """The tool graph (module docstring). Node attribute ``spec``: the tool; edge
    attributes ``io`` (list of (output, input) name pairs; empty for a similarity edge),
    ``similar`` (the cosine, 0 without) and ``weight`` (1 for io, else the cosine)."""
    g = nx.DiGraph()
    for t in tools:
        g.add_node(t.name, spec=t, domain=kinds[t.kind].domain if t.kind else "")
    consumers: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)   # input slot -> (tool, param)
    io = {t.name: slots(t, kinds) for t in tools}
    for t in tools:
        for param, slot in io[t.name][0].items():
            consumers[slot].append((t.name, param))
    for t in tools:
        for out, slot in io[t.name][1].items():
            wanted = [slot] + ([f"num:{slot.rpartition('@')[2]}"] if "@" in slot else [])
            for key in wanted:
                for b, param in consumers.get(key, ()):
                    if b != t.name and fits(slot, io[b][0][param]):
                        if not g.has_edge(t.name, b):
                            g.add_edge(t.name, b, io=[], similar=0.0, weight=1.0)
                        g.edges[t.name, b]["io"].append((out, param))
    sim = description_similarity(tools)
    rows, cols = np.nonzero(np.triu(sim >= threshold, k=1))
    for i, j in zip(rows.tolist(), cols.tolist()):
        for a, b in ((tools[i].name, tools[j].name), (tools[j].name, tools[i].name)):
            if g.has_edge(a, b):
                g.edges[a, b]["similar"] = float(sim[i, j])
            else:
                g.add_edge(a, b, io=[], similar=float(sim[i, j]), weight=float(sim[i, j]))
    return g


def undirected(g: nx.DiGraph) -> nx.Graph:
    """The graph Louvain reads: one edge per connected pair, weight the larger of the two
    directions'."""
    u = nx.Graph()
    u.add_nodes_from(g.nodes)
    for a, b, d in g.edges(data=True):
        w = max(d["weight"], u.edges[a, b]["weight"]) if u.has_edge(a, b) else d["weight"]
        u.add_edge(a, b, weight=w)
    return u


def communities(g: nx.DiGraph, *, seed: int, resolution: float = 1.0) -> list[list[str]]:
    """Louvain communities of ``g`` (seeded), each a sorted list of tool names, in order
    of their first name: deterministic in (graph, seed, resolution)."""
    found = nx.community.louvain_communities(undirected(g), weight="weight", resolution=resolution, seed=seed)
    return sorted((sorted(c) for c in found), key=lambda c: c[0])


def graph_stats(g: nx.DiGraph, groups: Sequence[Sequence[str]]) -> dict[str, Any]:
    """What the data set card says of the graph: counts of nodes and of io / similarity
    edges, communities and their sizes, Louvain's modularity, purity (module
    docstring), weakly connected components."""
    io = sum(1 for *_, d in g.edges(data=True) if d["io"])
    similar = sum(1 for *_, d in g.edges(data=True) if d["similar"] > 0)
    sizes = sorted(len(c) for c in groups)
    domain = dict(g.nodes(data="domain"))
    pure = 0
    for c in groups:              # a utility (no domain) counts with its community's most common domain
        counts = collections.Counter(domain[n] for n in c if domain[n])
        top = counts.most_common(1)[0][0] if counts else ""
        pure += sum(domain[n] in (top, "") for n in c)
    return {"tools": g.number_of_nodes(), "io_edges": io, "similar_edges": similar,
            "communities": len(groups), "community_size_min": sizes[0] if sizes else 0,
            "community_size_median": sizes[len(sizes) // 2] if sizes else 0,
            "community_size_max": sizes[-1] if sizes else 0,
            "modularity": round(float(nx.community.modularity(undirected(g), [set(c) for c in groups])), 4),
            "purity": round(pure / max(g.number_of_nodes(), 1), 4),
            "weak_components": nx.number_weakly_connected_components(g),
            "mean_out_degree": round(g.number_of_edges() / max(g.number_of_nodes(), 1), 2),
            "two_edge_paths": int(sum(g.in_degree(b) * g.out_degree(b) for b in g.nodes))}
