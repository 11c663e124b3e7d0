"""A byte-at-a-time JSON parser for the device (one row, jittable, vmappable).

:func:`json_table` is the transition table of a pushdown automaton for RFC 8259 JSON
as Python's ``json.loads`` reads it (whitespace `` \\t\\n\\r``; no NaN/Infinity; one
value, nothing after it), with the container stack as a 32-bit word (nesting deeper
than :data:`MAX_DEPTH` is an error). :func:`json_byte` feeds one byte and returns the
new :class:`JsonState` and the :class:`JsonEvents` the caller needs to give the values
a meaning: a value starts (and its kind), a key or a string value ends, a number ends
(with its value), and the unescaped string byte (``\\uXXXX`` escapes become UTF-8
bytes, at most one per input byte: the bytes of a code point are emitted while its
hex digits arrive, see :func:`_hex_emission`).

Numbers are kept exactly as jsonschema sees them: a number is an integer when its
decimal value is (``3.0``, ``1e2``, ``150e-1``), and its value is reported modulo
2**32 (two's complement int32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

MAX_DEPTH = 32

# parser states
(J_ERR, J_START, J_DONE, J_OBJ_OPEN, J_OBJ_KEY, J_COLON, J_VAL, J_ARR_OPEN, J_AFTER_OBJ, J_AFTER_ARR,
 J_STR, J_ESC, J_U1, J_U2, J_U3, J_U4, J_N_MINUS, J_N_ZERO, J_N_INT, J_N_DOT, J_N_FRAC, J_N_E, J_N_ESIGN,
 J_N_EXP, J_T1, J_T2, J_T3, J_F1, J_F2, J_F3, J_F4, J_L1, J_L2, J_L3, J_AFTER) = range(35)
# actions (what the byte does besides moving to the next state)
(A_NONE, A_OBJ, A_ARR, A_POP, A_KEY, A_VSTR, A_SEND, A_EMIT, A_ESC, A_ESCCH, A_U, A_HEX, A_NUM, A_DIGIT,
 A_DOT, A_EXP, A_ESIGN, A_NUM_END, A_TRUE, A_FALSE, A_NULL, A_LIT) = range(22)
# value kinds (also the argument kinds of the call record; 0 = absent)
K_NONE, K_STR, K_INT, K_NUM, K_TRUE, K_FALSE, K_NULL, K_OBJ, K_ARR = range(9)
# classes of a \uXXXX escape: undecided, 1/2/3-byte UTF-8, high surrogate, low surrogate after a high one
U_UNDEC, U_1, U_2, U_3, U_HI, U_LO = range(6)

_WS = b" \t\n\r"
_DIGITS = b"0123456789"
_HEX = b"0123456789abcdefABCDEF"
_ESCAPES = {ord('"'): 0x22, ord("\\"): 0x5C, ord("/"): 0x2F, ord("b"): 0x08, ord("f"): 0x0C,
            ord("n"): 0x0A, ord("r"): 0x0D, ord("t"): 0x09}
_CLAMP = 1_000_000  # digit counts and exponents saturate here (int32-safe sums)


def json_table() -> np.ndarray:
    """int32 [states, 256]: ``next | action << 6`` for every (state, byte)."""
    nxt = np.full([J_AFTER + 1, 256], J_ERR, np.int32)
    act = np.zeros([J_AFTER + 1, 256], np.int32)

    def put(state: int, chars: bytes | range, to: int, action: int = A_NONE) -> None:
        for c in chars:
            nxt[state, c], act[state, c] = to, action

    for s in (J_START, J_DONE, J_OBJ_OPEN, J_OBJ_KEY, J_COLON, J_VAL, J_ARR_OPEN, J_AFTER_OBJ, J_AFTER_ARR):
        put(s, _WS, s)
    put(J_START, b"{", J_OBJ_OPEN, A_OBJ)  # a call (or its arguments) must be an object
    for s in (J_VAL, J_ARR_OPEN):
        put(s, b"{", J_OBJ_OPEN, A_OBJ)
        put(s, b"[", J_ARR_OPEN, A_ARR)
        put(s, b'"', J_STR, A_VSTR)
        put(s, b"-", J_N_MINUS, A_NUM)
        put(s, b"0", J_N_ZERO, A_NUM)
        put(s, b"123456789", J_N_INT, A_NUM)
        put(s, b"t", J_T1, A_TRUE)
        put(s, b"f", J_F1, A_FALSE)
        put(s, b"n", J_L1, A_NULL)
    put(J_OBJ_OPEN, b'"', J_STR, A_KEY)
    put(J_OBJ_OPEN, b"}", J_AFTER, A_POP)
    put(J_OBJ_KEY, b'"', J_STR, A_KEY)
    put(J_COLON, b":", J_VAL)
    put(J_ARR_OPEN, b"]", J_AFTER, A_POP)
    put(J_AFTER_OBJ, b",", J_OBJ_KEY)
    put(J_AFTER_OBJ, b"}", J_AFTER, A_POP)
    put(J_AFTER_ARR, b",", J_VAL)
    put(J_AFTER_ARR, b"]", J_AFTER, A_POP)
    put(J_STR, range(0x20, 256), J_STR, A_EMIT)  # control characters are errors (strict json)
    put(J_STR, b'"', J_AFTER, A_SEND)  # -> J_COLON for a key (json_byte)
    put(J_STR, b"\\", J_ESC, A_ESC)
    put(J_ESC, bytes(_ESCAPES), J_STR, A_ESCCH)
    put(J_ESC, b"u", J_U1, A_U)
    for s in (J_U1, J_U2, J_U3):
        put(s, _HEX, s + 1, A_HEX)
    put(J_U4, _HEX, J_STR, A_HEX)
    put(J_N_MINUS, b"0", J_N_ZERO, A_DIGIT)
    put(J_N_MINUS, b"123456789", J_N_INT, A_DIGIT)
    put(J_N_INT, _DIGITS, J_N_INT, A_DIGIT)
    for s in (J_N_ZERO, J_N_INT):
        put(s, b".", J_N_DOT, A_DOT)
        put(s, b"eE", J_N_E, A_EXP)
    put(J_N_DOT, _DIGITS, J_N_FRAC, A_DIGIT)
    put(J_N_FRAC, _DIGITS, J_N_FRAC, A_DIGIT)
    put(J_N_FRAC, b"eE", J_N_E, A_EXP)
    put(J_N_E, b"+-", J_N_ESIGN, A_ESIGN)
    put(J_N_E, _DIGITS, J_N_EXP, A_DIGIT)
    put(J_N_ESIGN, _DIGITS, J_N_EXP, A_DIGIT)
    put(J_N_EXP, _DIGITS, J_N_EXP, A_DIGIT)
    for s in (J_N_ZERO, J_N_INT, J_N_FRAC, J_N_EXP):  # the byte after a number is read again
        put(s, _WS + b",}]", J_ERR, A_NUM_END)
    for word, states in ((b"true", (J_T1, J_T2, J_T3)), (b"false", (J_F1, J_F2, J_F3, J_F4)),
                         (b"null", (J_L1, J_L2, J_L3))):
        for i, s in enumerate(states):
            last = i == len(states) - 1
            put(s, word[i + 1:i + 2], J_AFTER if last else s + 1, A_LIT)
    return nxt | (act << 6)


def _byte_table(values: dict[int, int], default: int = 0) -> np.ndarray:
    out = np.full(256, default, np.int32)
    for k, v in values.items():
        out[k] = v
    return out


HEXVAL = _byte_table({c: int(chr(c), 16) for c in _HEX})
ESCMAP = _byte_table(_ESCAPES)
POW10 = np.asarray([pow(10, k, 2 ** 32) for k in range(34)], np.uint32)  # 10**k mod 2**32; 0 from k=32 on
_VKIND = _byte_table({A_OBJ: K_OBJ, A_ARR: K_ARR, A_VSTR: K_STR, A_NUM: K_NUM, A_TRUE: K_TRUE, A_FALSE: K_FALSE,
                      A_NULL: K_NULL})


@struct.dataclass
class JsonState:
    """One row's JSON parser (every field a scalar)."""

    st: jax.Array       # int32 parser state J_*
    depth: jax.Array    # int32 open containers
    stack: jax.Array    # uint32 bit i set: container i (from the outside) is an object
    key: jax.Array      # bool the open string is a key
    ucp: jax.Array      # int32 hex digits of the open \u escape so far
    ucls: jax.Array     # int32 U_* class of the open \u escape
    hi_pend: jax.Array  # bool a high-surrogate escape just ended (a low one may pair with it)
    hi_low2: jax.Array  # int32 that high surrogate's 2 low bits
    nneg: jax.Array     # bool the open number is negative
    nval: jax.Array     # uint32 its digits without their trailing zeros, mod 2**32
    ntz: jax.Array      # int32 trailing zero digits
    nnf: jax.Array      # int32 fraction digits
    nexp: jax.Array     # int32 |exponent|
    neneg: jax.Array    # bool negative exponent
    nnz: jax.Array      # bool a nonzero digit was read


@struct.dataclass
class JsonEvents:
    """What one byte did (all scalars; everything False/0 for a masked byte)."""

    depth: jax.Array    # int32 depth before the byte (the depth of the value, key or number)
    vstart: jax.Array   # bool a value starts
    vkind: jax.Array    # int32 its K_* kind (K_NUM for every number)
    sstart: jax.Array   # bool a string (key or value) starts
    kend: jax.Array     # bool a key string ends
    send: jax.Array     # bool a string value ends
    nend: jax.Array     # bool a number ended before this byte
    nkind: jax.Array    # int32 K_INT (integral) or K_NUM
    nvalue: jax.Array   # int32 the integral value mod 2**32
    emit: jax.Array     # bool an unescaped string byte comes out
    u: jax.Array        # int32 that byte


def json_init() -> JsonState:
    """A parser before the first byte (expects an object)."""
    i, f = jnp.int32(0), jnp.bool_(False)
    return JsonState(st=jnp.int32(J_START), depth=i, stack=jnp.uint32(0), key=f, ucp=i, ucls=i, hi_pend=f,
                     hi_low2=i, nneg=f, nval=jnp.uint32(0), ntz=i, nnf=i, nexp=i, neneg=f, nnz=f)


def _after(depth: jax.Array, stack: jax.Array) -> jax.Array:
    """The state after a complete value at ``depth``."""
    top_obj = ((stack >> jnp.maximum(depth - 1, 0).astype(jnp.uint32)) & 1) == 1
    return jnp.where(depth == 0, J_DONE, jnp.where(top_obj, J_AFTER_OBJ, J_AFTER_ARR))


def _hex_emission(j: JsonState, k: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(class, emit, byte) after hex digit ``k`` (1..4) of an escape whose digits so far are ``c``.

    A code point's UTF-8 bytes come out one per digit from the 2nd on: 3-byte at digits
    2, 3, 4; 2-byte at 3, 4; 1-byte at 4. A surrogate pair's 4 bytes come out at digits
    3, 4 of the high half and 3, 4 of the low half. A lone low surrogate is written as
    its 3-byte form (Python's ``surrogatepass``)."""
    cls2 = jnp.where((c >= 0xD8) & (c <= 0xDB), U_HI,
                     jnp.where((c >= 0xDC) & (c <= 0xDF) & j.hi_pend, U_LO,
                               jnp.where(c >= 0x08, U_3, jnp.where(c == 0, U_UNDEC, U_2))))
    cls3 = jnp.where(j.ucls == U_UNDEC, jnp.where(c >= 8, U_2, U_1), j.ucls)
    cls = jnp.where(k == 2, cls2, jnp.where(k == 3, cls3, j.ucls))
    mid = (c >> 2) & 0x3F
    at3 = jnp.select([cls == U_3, cls == U_2, cls == U_HI],
                     [0x80 | mid, 0xC0 | mid, 0xF0 | ((((c >> 2) & 0xF) + 1) >> 2)],
                     0x80 | (j.hi_low2 << 4) | ((c >> 2) & 0xF))
    at4 = jnp.select([cls == U_1, cls == U_HI], [c, 0x80 | (((c - 0xD800 + 0x40) >> 2) & 0x3F)], 0x80 | (c & 0x3F))
    byte = jnp.where(k == 2, 0xE0 | (c >> 4), jnp.where(k == 3, at3, at4))
    emit = ((k == 2) & (cls == U_3)) | ((k == 3) & (cls != U_1) & (cls != U_UNDEC)) | (k == 4)
    return cls, emit, byte


def _number(j: JsonState, act: jax.Array, b: jax.Array) -> JsonState:
    """The number registers after byte ``b`` (action ``act``)."""
    start = act == A_NUM
    z, f = jnp.int32(0), jnp.bool_(False)
    nneg, nval = jnp.where(start, b == ord("-"), j.nneg), jnp.where(start, jnp.uint32(0), j.nval)
    ntz, nnf, nexp = (jnp.where(start, z, x) for x in (j.ntz, j.nnf, j.nexp))
    neneg, nnz = jnp.where(start, f, j.neneg), jnp.where(start, f, j.nnz)
    d = b - ord("0")
    is_digit = (d >= 0) & (d <= 9)
    mant_state = (j.st == J_N_MINUS) | (j.st == J_N_INT) | (j.st == J_N_DOT) | (j.st == J_N_FRAC)
    mant = (start & is_digit) | ((act == A_DIGIT) & mant_state)
    frac = (act == A_DIGIT) & ((j.st == J_N_DOT) | (j.st == J_N_FRAC))
    expd = (act == A_DIGIT) & ~mant_state
    nonzero = mant & (d != 0)
    scale = jnp.asarray(POW10)[jnp.minimum(ntz + 1, 33)]
    nval = jnp.where(nonzero, nval * scale + d.astype(jnp.uint32), nval)
    ntz = jnp.where(mant, jnp.where(d != 0, 0, jnp.minimum(ntz + 1, _CLAMP)), ntz)
    nnf = jnp.minimum(nnf + frac, _CLAMP)
    nexp = jnp.where(expd, jnp.minimum(nexp * 10 + d, _CLAMP), nexp)
    neneg = jnp.where(act == A_ESIGN, b == ord("-"), neneg)
    return j.replace(nneg=nneg, nval=nval, ntz=ntz, nnf=nnf, nexp=nexp, neneg=neneg, nnz=nnz | nonzero)


def _number_value(j: JsonState) -> tuple[jax.Array, jax.Array]:
    """(K_INT or K_NUM, value int32) of the number just read."""
    shift = j.ntz - j.nnf + jnp.where(j.neneg, -j.nexp, j.nexp)
    integral = ~j.nnz | (shift >= 0)
    mag = j.nval * jnp.asarray(POW10)[jnp.clip(shift, 0, 33)]
    value = jax.lax.bitcast_convert_type(jnp.where(j.nneg, -mag, mag), jnp.int32)
    return jnp.where(integral, K_INT, K_NUM), jnp.where(integral, value, 0)


def json_byte(table: jax.Array, j: JsonState, b: jax.Array, valid: jax.Array) -> tuple[JsonState, JsonEvents]:
    """Feed byte ``b`` (int32 scalar) to one row's parser; a byte with ``valid`` False
    changes nothing. ``table`` is :func:`json_table` on the device."""
    t = table[j.st, b]
    reread = (t >> 6) == A_NUM_END
    t = jnp.where(reread, table[_after(j.depth, j.stack), b], t)
    nxt, act = t & 63, t >> 6
    push = (act == A_OBJ) | (act == A_ARR)
    shift = jnp.minimum(j.depth, MAX_DEPTH - 1).astype(jnp.uint32)
    stack = jnp.where(push, (j.stack & ~(jnp.uint32(1) << shift)) | ((act == A_OBJ).astype(jnp.uint32) << shift),
                      j.stack)
    depth = j.depth + push.astype(jnp.int32) - (act == A_POP).astype(jnp.int32)
    send = act == A_SEND
    nxt = jnp.where(nxt == J_AFTER, _after(depth, stack), nxt)
    nxt = jnp.where(send & j.key, J_COLON, nxt)
    nxt = jnp.where(push & (j.depth >= MAX_DEPTH), J_ERR, nxt)
    # strings and escapes
    is_hex = act == A_HEX
    k = j.st - J_U1 + 1
    ucp = jnp.where(act == A_U, 0, jnp.where(is_hex, j.ucp * 16 + jnp.asarray(HEXVAL)[b], j.ucp))
    cls, hex_emit, hex_byte = _hex_emission(j, k, ucp)
    low_range = (ucp >= 0xDC) & (ucp <= 0xDF)
    keep = (act == A_ESC) | (act == A_U) | (is_hex & ((k == 1) | (k == 3) | ((k == 2) & low_range)))
    hi_pend = jnp.where(is_hex & (k == 4), cls == U_HI, j.hi_pend & keep)
    hi_low2 = jnp.where(is_hex & (k == 4) & (cls == U_HI), (ucp - 0xD800) & 3, j.hi_low2)
    u = jnp.where(act == A_EMIT, b, jnp.where(act == A_ESCCH, jnp.asarray(ESCMAP)[b], hex_byte))
    emit = (act == A_EMIT) | (act == A_ESCCH) | (is_hex & hex_emit)
    nkind, nvalue = _number_value(j)
    new = _number(j, act, b).replace(
        st=nxt, depth=depth, stack=stack, key=jnp.where(act == A_KEY, True, jnp.where(act == A_VSTR, False, j.key)),
        ucp=ucp, ucls=jnp.where(is_hex, cls, j.ucls), hi_pend=hi_pend, hi_low2=hi_low2)
    vstart = push | (act == A_VSTR) | (act == A_NUM) | (act == A_TRUE) | (act == A_FALSE) | (act == A_NULL)
    events = JsonEvents(depth=j.depth, vstart=valid & vstart, vkind=jnp.asarray(_VKIND)[act],
                        sstart=valid & ((act == A_KEY) | (act == A_VSTR)), kend=valid & send & j.key,
                        send=valid & send & ~j.key, nend=valid & reread, nkind=nkind, nvalue=nvalue,
                        emit=valid & emit, u=u)
    return jax.tree.map(lambda a, o: jnp.where(valid, a, o), new, j), events
