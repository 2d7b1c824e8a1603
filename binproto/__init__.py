"""binproto: a Sans-IO parser and encoder for the Open Inference Protocol
(KServe V2 / Triton) binary tensor data extension.

The core does no I/O: feed body bytes in any chunking to a :class:`Parser` and
pull events; adapters under ``binproto.adapters`` connect it to sockets.
"""

from ._assemble import TensorAssembler
from ._bytes import BytesDecoder, BytesFramer, join_bytes, split_bytes
from ._compression import compress_buffers
from ._datatypes import DATATYPES, BF16BitsWarning, DataType, datatype_for_dtype, datatype_of
from ._decode import DecodedMessage, decode_request, decode_response
from ._encode import EncodedBody, Tensor, encode_request, encode_response
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._events import (
    NEED_DATA,
    Event,
    HeaderParsed,
    MessageComplete,
    NeedData,
    TensorChunk,
    TensorComplete,
)
from ._header import InferenceHeader, Kind, RequestedOutput, TensorInfo
from ._http import (
    HEADER_LENGTH_NAME,
    BodyClaims,
    HeaderFields,
    body_claims,
    content_encoding_from,
    header_length_from,
    message_headers,
    parser_from_headers,
    preferred_encoding,
    raw_message_headers,
)
from ._limits import Limits
from ._parser import Parser, ParserState
from ._raw import TensorSpec
from ._writer import BodyWriter

__version__ = "0.1.0"

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH_NAME",
    "NEED_DATA",
    "BF16BitsWarning",
    "BodyClaims",
    "BodyWriter",
    "BytesDecoder",
    "BytesFramer",
    "DataType",
    "DecodedMessage",
    "EncodedBody",
    "Event",
    "HeaderFields",
    "HeaderParsed",
    "InferenceHeader",
    "Kind",
    "Limits",
    "LocalProtocolError",
    "MessageComplete",
    "NeedData",
    "Parser",
    "ParserState",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestedOutput",
    "Tensor",
    "TensorAssembler",
    "TensorChunk",
    "TensorComplete",
    "TensorInfo",
    "TensorSpec",
    "__version__",
    "body_claims",
    "compress_buffers",
    "content_encoding_from",
    "datatype_for_dtype",
    "datatype_of",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "header_length_from",
    "join_bytes",
    "message_headers",
    "parser_from_headers",
    "preferred_encoding",
    "raw_message_headers",
    "split_bytes",
]
