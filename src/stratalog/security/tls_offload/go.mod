module stratalog/tlsoffload

go 1.19
