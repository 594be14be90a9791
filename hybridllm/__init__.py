"""hybridllm: answer LLM requests on the device when it can, in the cloud when it must.

    from hybridllm import HybridLLM
    llm = HybridLLM()
    print(llm.chat("What is the capital of France?").text)
"""

from ._client import AsyncHybridLLM, HybridLLM, Stream
from ._exceptions import (
    BackendError,
    CacheCorruptError,
    CacheError,
    CloudAuthError,
    CloudError,
    CloudRateLimitError,
    CloudUnavailableError,
    ConfigError,
    DataError,
    EdgeError,
    HybridLLMError,
    InvalidRequestError,
    ModelCorruptError,
    ModelError,
    ModelNotFoundError,
    ModelPackageMissingError,
    RouterError,
    RouterFileError,
)
from ._types import Chunk, Completion, GenerationParams, Usage
from .backends.base import Backend, Delta

__version__ = "0.1.0"

__all__ = [
    "AsyncHybridLLM",
    "Backend",
    "BackendError",
    "CacheCorruptError",
    "CacheError",
    "Chunk",
    "CloudAuthError",
    "CloudError",
    "CloudRateLimitError",
    "CloudUnavailableError",
    "Completion",
    "ConfigError",
    "DataError",
    "Delta",
    "EdgeError",
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
    "Usage",
    "__version__",
]
