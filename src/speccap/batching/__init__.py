"""The runtime that batches models: sessions of one model as rows of one KV cache (row_pool,
batched_step), the executor that steps many caption loops together (lockstep) and the verifier
server's gathering of concurrent requests into one forward (gather)."""
