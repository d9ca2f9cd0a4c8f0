"""What every arm trains with and how the suite runs them fairly: tasks, context, data order and schedule, loops, runner."""
