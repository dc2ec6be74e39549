"""What a user or an external system drives the processor with: submit, query, complete."""
