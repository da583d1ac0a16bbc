# mistake: a copied file still extends its own name
design extends_itself extends extends_itself

replace size H = 4
