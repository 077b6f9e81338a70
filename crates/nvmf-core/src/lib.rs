//! nvmf-core (skeleton; being written)
