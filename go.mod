module devicegate

go 1.26.0
