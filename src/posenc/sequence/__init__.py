"""What a forward's tokens are: positions, masks, packed documents, the KV cache."""
