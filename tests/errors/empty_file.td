# mistake: an empty design file (only this comment)
