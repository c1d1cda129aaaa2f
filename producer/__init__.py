"""Producer: read prompts, render and tokenize them, budget them, enqueue them."""
