"""Random tokenisations of a text for the device parsers' fuzz tests: the same bytes as
different id sequences (chunks of 1-12 bytes encoded separately, a character cut in
two as its byte tokens; tags as their added id or spelled in ordinary tokens)."""

import re

from swarmjax.text.byte_tries import bytes_to_unicode


class Splitter:
    """Encodes a text as different id sequences of the same bytes."""

    def __init__(self, tok):
        self.tok = tok
        self.added = tok.added_tokens
        self.tags = re.compile("|".join(re.escape(t) for t in sorted(self.added, key=len, reverse=True)))
        chars = bytes_to_unicode()
        self.byte_id = [tok.backend.token_to_id(chars[b]) for b in range(256)]

    def chunks(self, s, r):
        data, out, i = s.encode("utf-8"), [], 0
        while i < len(data):
            n = r.randint(1, 12)
            piece = data[i:i + n]
            try:
                out += self.tok.encode(piece.decode("utf-8")).tolist()
            except UnicodeDecodeError:  # a character cut in two: its bytes as byte tokens
                out += [self.byte_id[b] for b in piece]
            i += n
        return out

    def __call__(self, s, r, spell):
        ids, pos = [], 0
        for m in self.tags.finditer(s):
            ids += self.chunks(s[pos:m.start()], r)
            tag = m.group()
            if r.random() < spell:
                cut = r.randint(1, len(tag) - 1)
                ids += self.tok.encode(tag[:cut]).tolist() + self.tok.encode(tag[cut:]).tolist()
            else:
                ids.append(self.added[tag])
            pos = m.end()
        return ids + self.chunks(s[pos:], r)
