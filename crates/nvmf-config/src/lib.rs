//! nvmf-config (skeleton; being written)
