"""How each sample's score becomes its keep priority, its draw, its loss weight and the noise guard's exclusion."""
