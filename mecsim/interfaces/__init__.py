"""What a person or a program touches: the command line, the service, metrics, the console."""
