"""What every arm trains with and how the runs go fairly: context, data order and schedule, loops, the runners (the suite's, the language-model task's), costs."""
