"""What the machine offers: cores, their speed classes, memory, container limits."""
