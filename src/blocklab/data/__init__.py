"""blocklab.data: corpora, tokenizers, cached token shards and deterministic batches for the trainer.

```python
from blocklab.data import DataConfig, prepare_data, Batches, bits_per_byte

data = prepare_data(DataConfig())            # embedded Python-stdlib snapshot, BPE-4096, cached
batches = Batches(data, "train", batch_size=32, seq_len=128, seed=0)
batch = batches.get(step, rank, world_size)  # {"input_ids", "labels"}: (32 / world_size, 128)
for batch in batches.validation(32): ...
bpb = bits_per_byte(val_loss, data.bytes_per_token["val"])
```
"""

from blocklab.data.batches import Batches, bits_per_byte
from blocklab.data.cache_folder import cache_root
from blocklab.data.config import DataConfig
from blocklab.data.prepare import PreparedData, prepare_data
from blocklab.data.snapshot import iter_snapshot, snapshot_info
from blocklab.data.sources import open_source, split_of
from blocklab.data.tokenizer import Tokenizer, byte_tokenizer, load_tokenizer, train_bpe

__all__ = ["Batches", "DataConfig", "PreparedData", "Tokenizer", "bits_per_byte", "byte_tokenizer",
           "cache_root", "iter_snapshot", "load_tokenizer", "open_source", "prepare_data", "snapshot_info",
           "split_of", "train_bpe"]
