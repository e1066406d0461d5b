"""Models: where their files come from, how they are verified, and the runners that execute them."""
