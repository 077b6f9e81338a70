//! nvmf-tcp (skeleton; being written)
