"""What one request may make esqbe do: the caps on a query's text and the default request deadline, in one
place. The CLI, the Python API and `esqbe serve` all go through the library's one check of a request's free
texts (`esqbe.query.search.query_texts`: characters, then sentences, counted on each whole text, refused before
any tagging or encoding, whichever sentences the request then chooses); the rescorers' own parameter bounds live
in their declarations (`esqbe.rescore.registry.Param`).
"""
from __future__ import annotations

#: characters of a query text, all sentences together (a long abstract is ~3,000; a whole paper's body ~60,000)
MAX_QUERY_CHARS = 100_000
#: characters of one query sentence (one past this is not a sentence: a text without sentence ends)
MAX_QUERY_SENTENCE_CHARS = 5_000
#: sentences of a request's free texts, all of them together (a query text, the texts of a query's examples, a
#: watch's, a rerank query's), each text counted whole: every sentence of a text is tagged and encoded in its
#: context, whichever of them the request chooses. `esqbe serve --max-query-sentences` may lower it, not raise it
MAX_QUERY_SENTENCES = 64
#: the encoder hands the tokenizer at most this many characters per token the model takes from a sentence
#: (or a title): far more than any wordpiece needs, so only text the model would truncate anyway is cut
ENCODE_CHARS_PER_TOKEN = 16

#: `esqbe serve`: seconds a query may take, waiting for a reader included, before it is abandoned (504)
REQUEST_TIMEOUT_S = 30.0
MAX_REQUEST_TIMEOUT_S = 3600.0

#: a query of several examples (esqbe.query.combine): at most this many examples, this many papers to avoid, and
#: this many query sentences, all examples together (the first stage runs one kNN per sentence)
MAX_EXAMPLES = 16
MAX_AVOID = 16
MAX_EXAMPLE_SENTENCES = 64

#: a filter's value list (`venue in (...)`, `authors.name in [...]`): at most this many values, and this many bytes of
#: text (UTF-8) all together; the settings filter_max_values and filter_max_bytes may lower them, not raise them
MAX_FILTER_VALUES = 1000
MAX_FILTER_BYTES = 64 * 1024
