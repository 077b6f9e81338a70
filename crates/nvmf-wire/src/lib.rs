//! nvmf-wire (skeleton; being written)
