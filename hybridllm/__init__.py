"""hybridllm: answer LLM requests on the device when it can, in the cloud when it must.

    from hybridllm import HybridLLM
    llm = HybridLLM()
    print(llm.chat("What is the capital of France?").text)
"""

from ._client import AsyncHybridLLM, AsyncStream, HybridLLM, Stream
from ._exceptions import (
    BackendError,
    CacheCorruptError,
    CacheError,
    CloudAuthError,
    CloudBudgetSpentError,
    CloudError,
    CloudRateLimitError,
    CloudUnavailableError,
    ConfigError,
    ContextWindowExceededError,
    DataError,
    EdgeBusyError,
    EdgeError,
    HybridLLMError,
    InvalidRequestError,
    ModelCorruptError,
    ModelError,
    ModelNotFoundError,
    ModelPackageMissingError,
    RouterError,
    RouterFileError,
    StreamConsumedError,
)
from ._tools import Function, ToolCall, ToolCallDelta
from ._types import Chunk, Completion, Decision, GenerationParams, Usage
from .backends.base import Backend, Delta

__version__ = "0.1.0"

__all__ = [
    "AsyncHybridLLM",
    "AsyncStream",
    "Backend",
    "BackendError",
    "CacheCorruptError",
    "CacheError",
    "Chunk",
    "CloudAuthError",
    "CloudBudgetSpentError",
    "CloudError",
    "CloudRateLimitError",
    "CloudUnavailableError",
    "Completion",
    "ConfigError",
    "ContextWindowExceededError",
    "DataError",
    "Decision",
    "Delta",
    "EdgeBusyError",
    "EdgeError",
    "Function",
    "GenerationParams",
    "HybridLLM",
    "HybridLLMError",
    "InvalidRequestError",
    "ModelCorruptError",
    "ModelError",
    "ModelNotFoundError",
    "ModelPackageMissingError",
    "RouterError",
    "RouterFileError",
    "Stream",
    "StreamConsumedError",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "__version__",
]
