"""The SGLang attention backend "atom" and the atom-core attention layers ATOM models use inside SGLang."""
