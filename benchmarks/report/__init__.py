"""What the records become: the paired numbers and the tables, their confidence intervals, the plots."""
