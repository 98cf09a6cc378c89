"""What runs next: requests become sequences, the scheduler picks each step's tokens, the model runs them."""
