//! nvmf-host (skeleton; being written)
